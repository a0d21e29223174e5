#include "dlasync/gpu_stream.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "dlasync/import.hpp"
#include "support/runtime_fixture.hpp"
#include "support/sim_reports.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using namespace std::chrono_literals;
using testing::require_status;

const device gpu0{device_kind::cuda, 0};

}  // namespace

TEST_CASE("a caller's stream runs host functions in order and is waited for",
          "[runtime][stream][cuda]") {
  testing::sim_runtime r = testing::make_sim_runtime();
  absl::StatusOr<gpu_stream> s = gpu_stream::create(*r.rt, gpu0);
  REQUIRE(s.ok());
  CHECK(s->device() == gpu0);
  CHECK(s->dlpack_stream() == reinterpret_cast<std::int64_t>(s->native_handle()));
  CHECK(s->dlpack_stream() > 2);  // a stream of its own, not a default one
  std::vector<int> order;
  for (int i = 0; i < 10; ++i) {
    REQUIRE(s->launch_host_function([&order, i] {
               if (i == 0) std::this_thread::sleep_for(5ms);
               order.push_back(i);
             }).ok());
  }
  // Moved, the stream goes with its handle; assigned over, the old one is
  // destroyed first.
  const std::int64_t value = s->dlpack_stream();
  gpu_stream moved = *std::move(s);
  CHECK(moved.dlpack_stream() == value);
  absl::StatusOr<gpu_stream> other = gpu_stream::create(*r.rt, gpu0);
  REQUIRE(other.ok());
  *other = std::move(moved);
  CHECK(other->dlpack_stream() == value);
  REQUIRE(other->synchronize().ok());
  std::vector<int> want(10);
  std::iota(want.begin(), want.end(), 0);
  CHECK(order == want);
}

TEST_CASE("an asynchronous wait on a stream completes once its work has run",
          "[runtime][stream][cuda]") {
  testing::sim_runtime r = testing::make_sim_runtime();
  absl::StatusOr<gpu_stream> s = gpu_stream::create(*r.rt, {device_kind::cuda, 1});
  REQUIRE(s.ok());
  std::atomic<bool> release{false};
  std::atomic<bool> ran{false};
  REQUIRE(s->launch_host_function([&] {
             while (!release) std::this_thread::sleep_for(1ms);
             ran = true;
           }).ok());
  std::future<absl::Status> waited = s->async_wait(asio::use_future);
  CHECK(waited.wait_for(20ms) == std::future_status::timeout);
  release = true;
  REQUIRE(waited.wait_for(10s) == std::future_status::ready);
  CHECK(waited.get().ok());
  CHECK(ran);
}

TEST_CASE("a caller's stream copies between host and device and orders after an import",
          "[runtime][stream][cuda]") {
  testing::sim_runtime r = testing::make_sim_runtime();
  absl::StatusOr<gpu_stream> s = gpu_stream::create(*r.rt, gpu0);
  REQUIRE(s.ok());
  std::vector<float> host(1024);
  std::iota(host.begin(), host.end(), 0.0f);
  testing::deleter_count count;
  testing::tensor_spec spec;
  spec.shape = {1024};
  spec.data = host.data();
  managed_tensor source = testing::make_tensor(spec, count);
  import_options o;
  o.target = gpu0;
  o.consumer_stream = s->dlpack_stream();
  absl::StatusOr<tensor> t = async_import_dlpack(*r.rt, source, o, asio::use_future).get();
  REQUIRE(t.ok());
  // The stream follows the import on the device: a copy back on it sees
  // the imported data, once the stream has run it.
  std::vector<float> back(1024, -1.0f);
  REQUIRE(s->copy_async(back.data(), t->data(), back.size() * sizeof(float)).ok());
  REQUIRE(s->synchronize().ok());
  CHECK(back == host);
  CHECK(testing::eventually([&] { return count.calls == 1; }));
}

TEST_CASE("streams are refused on devices that are no GPU of the runtime",
          "[runtime][stream][cuda]") {
  testing::sim_runtime r = testing::make_sim_runtime();
  require_status(gpu_stream::create(*r.rt, host_device).status(),
                 absl::StatusCode::kInvalidArgument, {"cpu:0 is not a GPU"});
  require_status(gpu_stream::create(*r.rt, {device_kind::cuda, 5}).status(),
                 absl::StatusCode::kNotFound, {"cuda:5"});
  std::unique_ptr<runtime> host_only = testing::make_runtime();
  require_status(gpu_stream::create(*host_only, gpu0).status(), absl::StatusCode::kUnimplemented,
                 {"cuda:0", "not served"});
  std::future<absl::Status> no_gpu =
      async_wait_for_stream(*host_only, gpu0, stream_legacy_default, asio::use_future);
  require_status(no_gpu.get(), absl::StatusCode::kUnimplemented, {"cuda:0"});
  for (const std::int64_t value : {std::int64_t{0}, stream_no_sync, std::int64_t{-5}}) {
    require_status(async_wait_for_stream(*r.rt, gpu0, value, asio::use_future).get(),
                   absl::StatusCode::kInvalidArgument, {"names no stream"});
  }
  int not_a_stream = 0;
  std::future<absl::Status> bad = async_wait_for_stream(
      *r.rt, gpu0, reinterpret_cast<std::int64_t>(&not_a_stream), asio::use_future);
  require_status(bad.get(), absl::StatusCode::kInternal,
                 {"cudaEventRecord", "cudaErrorInvalidResourceHandle"});
  // A GPU would not say why; the simulation names the handle (asked for
  // its device, then recorded on).
  testing::require_reports(*r.sim, 2, {"cudaErrorInvalidResourceHandle", "names no live stream"});
  r.sim->fail_call("cudaStreamCreateWithFlags", 1, cuda::error::memory_allocation);
  require_status(gpu_stream::create(*r.rt, gpu0).status(), absl::StatusCode::kResourceExhausted,
                 {"cudaStreamCreateWithFlags", "cuda:0"});
}

}  // namespace dlasync
