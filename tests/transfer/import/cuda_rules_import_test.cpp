// Imports against the CUDA rules that dlasync once broke, on simulated GPUs
// that enforce them (the same scenarios run on a real GPU in
// import_gpu_test.cpp). Each failed on the old code under the strict
// simulation: a misaligned gather faulted, a strided peer copy recorded an
// event on another device's stream, stream 2 was recorded on the wrong
// thread, every GPU got a context and the caller's device changed.
#include <chrono>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "runtime/sim/sim_api.hpp"
#include "support/cuda_rule_scenarios.hpp"
#include "support/runtime_fixture.hpp"
#include "support/sim_reports.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::make_sim_runtime;
using testing::make_tensor;
using testing::sim_runtime;
using testing::tensor_spec;

// The runtime of local rank `rank` of 2 processes on a node of 2 simulated
// GPUs: it owns cuda:`rank`.
sim_runtime local_rank_runtime(int rank) {
  return make_sim_runtime({}, [rank](runtime_options& o) {
    process_topology t;
    t.rank = rank;
    t.world_size = 2;
    t.local_rank = rank;
    t.local_world_size = 2;
    o.topology = t;
  });
}

}  // namespace

TEST_CASE("a misaligned strided source is gathered with the words its address allows",
          "[cuda][import][rules]") {
  sim_runtime r = make_sim_runtime();
  testing::scenario_misaligned_gather(*r.rt, 0);
  testing::scenario_misaligned_gather(*r.rt, 1);
  CHECK(r.sim->sticky_error() == cuda::error::success);
}

TEST_CASE("an earlier failed call on the thread does not fail the gather's launch",
          "[cuda][import][rules]") {
  sim_runtime r = make_sim_runtime();
  testing::scenario_launch_after_failed_call(*r.rt, 1);
}

TEST_CASE("producer stream 2 is recorded on the importing thread, whoever grants the budget",
          "[cuda][import][rules][stream]") {
  sim_runtime r = make_sim_runtime({}, [](runtime_options& o) { o.copy_memory_budget = 4096; });
  testing::scenario_per_thread_producer(*r.rt, 1, std::chrono::milliseconds(40));
}

TEST_CASE("a strided peer copy orders its streams with events of their own devices",
          "[cuda][import][rules]") {
  sim_runtime r = make_sim_runtime();
  std::vector<float> host(64 * 32);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  testing::device_memory mem(*r.sim, 1, host.data(), host.size() * sizeof(float));
  const std::uint64_t before = r.sim->device_bytes_in_use(1);
  testing::layout_case c{"transposed", {32, 64}, std::vector<std::int64_t>{1, 32}};
  for (int run = 0; run < 3; ++run) {
    tensor_spec s;
    s.device = {device_kind::cuda, 1};
    s.shape = c.shape;
    s.strides = c.strides;
    s.data = mem.data;
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.target = device{device_kind::cuda, 0};
    absl::StatusOr<tensor> t = testing::import_now(*r.rt, source, o);
    INFO("status: " << t.status().ToString());
    REQUIRE(t.ok());
    CHECK(testing::read_back(*r.sim, *t) ==
          testing::expected_bytes(host.data(), c, dtypes::float32));
    t = absl::UnknownError("dropped");
    CHECK(testing::eventually([&] { return count.calls == 1; }));
  }
  // The temporary on cuda:1 was freed every time.
  CHECK(testing::eventually([&] { return r.sim->device_bytes_in_use(1) == before; }));
}

TEST_CASE("a process opens contexts only on the GPUs it owns", "[cuda][runtime][rules]") {
  for (int rank = 0; rank < 2; ++rank) {
    INFO("local rank " << rank << " of 2");
    sim_runtime r = local_rank_runtime(rank);
    CHECK(r.sim->contexts() == std::vector<int>{rank});
    // Its GPU works; the other is refused, naming its owner.
    std::vector<float> host(256, 1.0f);
    tensor_spec s;
    s.shape = {256};
    s.data = host.data();
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.target = device{device_kind::cuda, rank};
    REQUIRE(testing::import_now(*r.rt, source, o).ok());
    o.target = device{device_kind::cuda, 1 - rank};
    managed_tensor again = make_tensor(s, count);
    testing::require_status(testing::import_now(*r.rt, again, o).status(),
                            absl::StatusCode::kFailedPrecondition, {"belongs to", "rank"});
    CHECK(r.sim->contexts() == std::vector<int>{rank});
    CHECK(testing::released(count));  // the copy's; `again` still holds its tensor
  }
  sim_runtime both = make_sim_runtime();
  CHECK(both.sim->contexts().size() == 2);
}

TEST_CASE("the caller's current device is what it was after dlasync's calls",
          "[cuda][runtime][rules]") {
  auto sim = std::make_shared<cuda::sim_api>();
  REQUIRE(sim->set_device(1) == cuda::error::success);
  sim_runtime r = make_sim_runtime();
  int current = -1;
  // The runtime's own simulation: this thread's device is per thread and
  // shared by simulations, as cudart's is per thread.
  REQUIRE(r.sim->get_device(&current) == cuda::error::success);
  CHECK(current == 1);
  absl::StatusOr<gpu_stream> s = gpu_stream::create(*r.rt, {device_kind::cuda, 0});
  REQUIRE(s.ok());
  REQUIRE(r.sim->get_device(&current) == cuda::error::success);
  CHECK(current == 1);
  // An import that records its producer's stream on this thread.
  std::vector<float> host(256);
  testing::device_memory mem(*r.sim, 0, host.data(), host.size() * sizeof(float));
  REQUIRE(r.sim->set_device(1) == cuda::error::success);
  tensor_spec spec;
  spec.device = {device_kind::cuda, 0};
  spec.shape = {256};
  spec.data = mem.data;
  deleter_count count;
  managed_tensor source = make_tensor(spec, count);
  import_options o;
  o.stream = s->dlpack_stream();
  o.target = host_device;
  REQUIRE(testing::import_now(*r.rt, source, o).ok());
  REQUIRE(r.sim->get_device(&current) == cuda::error::success);
  CHECK(current == 1);
  CHECK(testing::released(count));
}

TEST_CASE("a thread with no context is left with none, and no context on device 0",
          "[cuda][runtime][rules]") {
  std::thread([] {
    // The process of local rank 1 of 2, serving cuda:1 only.
    sim_runtime r = local_rank_runtime(1);
    std::vector<float> host(256, 1.0f);
    tensor_spec s;
    s.shape = {256};
    s.data = host.data();
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.target = device{device_kind::cuda, 1};
    REQUIRE(testing::import_now(*r.rt, source, o).ok());
    cuda::context_t current = nullptr;
    REQUIRE(r.sim->get_current_context(&current) == cuda::error::success);
    CHECK(current == nullptr);
    // Restoring "device 0" with cudaSetDevice would have opened its context.
    CHECK(r.sim->contexts() == std::vector<int>{1});
    CHECK(testing::released(count));
  }).join();
}

TEST_CASE("consumer stream 2 is refused: the wait would land on another thread's stream",
          "[cuda][import][rules][stream]") {
  sim_runtime r = make_sim_runtime();
  std::vector<float> host(64, 1.0f);
  tensor_spec s;
  s.shape = {64};
  s.data = host.data();
  deleter_count count;
  managed_tensor source = make_tensor(s, count);
  import_options o;
  o.target = device{device_kind::cuda, 0};
  o.consumer_stream = stream_per_thread_default;
  testing::require_status(testing::import_now(*r.rt, source, o).status(),
                          absl::StatusCode::kInvalidArgument,
                          {"consumer_stream 2", "per-thread default stream", "another thread",
                           "gpu_stream::dlpack_stream()"});
  CHECK(!source.empty());
  CHECK(count.calls == 0);
}

}  // namespace dlasync
