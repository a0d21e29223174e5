// Imports to, from and between GPUs on two simulated GPUs.
#include <chrono>
#include <map>
#include <numeric>
#include <string>
#include <thread>

#include "asio/bind_cancellation_slot.hpp"
#include "asio/bind_executor.hpp"
#include "asio/cancellation_signal.hpp"
#include "asio/io_context.hpp"
#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"
#include "support/copy_budget.hpp"
#include "support/cuda_scenarios.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::import_now;
using testing::make_tensor;
using testing::require_status;
using testing::tensor_spec;

using testing::sim_runtime;

// Simulated GPUs with `chunks` staging chunks of `chunk_bytes`.
sim_runtime make_sim_runtime(cuda::sim_options so = {}, int chunks = 4,
                             std::uint64_t chunk_bytes = 64 << 10) {
  return testing::make_sim_runtime(so, [&](runtime_options& o) {
    o.staging_chunks = chunks;
    o.staging_chunk_bytes = chunk_bytes;
  });
}

void sim_delayed_write(cuda::sim_api& sim, cuda::stream_t producer, void* dst,
                       const std::vector<float>& values) {
  REQUIRE(sim.launch_host_func(producer, [dst, values] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    std::memcpy(dst, values.data(), values.size() * sizeof(float));
  }) == cuda::error::success);
}

}  // namespace

TEST_CASE("simulated GPUs are served and named as simulated", "[cuda][import]") {
  sim_runtime r = make_sim_runtime();
  CHECK(r.rt->registry().served_list().find("cuda (cuda (simulated) backend, 2 devices)") !=
        std::string::npos);
  CHECK(r.rt->registry().addressable_list() ==
        "cpu:0, cuda:0, cuda:1, cuda_host:0, cuda_managed:0, cuda_managed:1");
}

TEST_CASE("host tensors reach a GPU through pinned staging, never pageable copies",
          "[cuda][import]") {
  sim_runtime r = make_sim_runtime();
  testing::scenario_host_to_gpu(*r.rt, 1, [&] { return r.sim->stats().pageable_copies; });
}

TEST_CASE("pageable host memory imported onto cuda_host is copied into page-locked memory",
          "[cuda][import]") {
  sim_runtime r = make_sim_runtime();
  testing::scenario_host_to_page_locked(*r.rt, 1);
}

TEST_CASE("GPU tensors come back to the host, strided ones compacted first", "[cuda][import]") {
  sim_runtime r = make_sim_runtime();
  testing::scenario_gpu_to_host(*r.rt, 0);
  testing::scenario_gpu_layouts_to_host(*r.rt, 1);
}

TEST_CASE("GPU tensors are viewed, copied, compacted and moved between GPUs", "[cuda][import]") {
  sim_runtime r = make_sim_runtime();
  testing::scenario_gpu_to_gpu(*r.rt, 0, 1);
}

TEST_CASE("managed memory is viewed in place on its GPU and copied elsewhere",
          "[cuda][import][managed]") {
  sim_runtime r = make_sim_runtime();
  testing::scenario_managed(*r.rt, 0, 1);
  testing::scenario_managed(*r.rt, 1, 0);
}

TEST_CASE("pinned sources follow the producer's stream, as views and as host copies",
          "[cuda][import][stream]") {
  sim_runtime r = make_sim_runtime();
  void* pinned = nullptr;
  REQUIRE(r.sim->malloc_host(&pinned, 1024 * sizeof(float)) == cuda::error::success);
  cuda::stream_t producer = nullptr;
  r.sim->set_device(0);
  REQUIRE(r.sim->stream_create(&producer, cuda::stream_flags::non_blocking) ==
          cuda::error::success);
  for (const bool view : {true, false}) {
    INFO((view ? "a view" : "a copy (copy=true) to cpu:0, by the host backend"));
    std::fill_n(static_cast<float*>(pinned), 1024, -1.0f);
    std::vector<float> fresh(1024);
    std::iota(fresh.begin(), fresh.end(), view ? 0.0f : 100.0f);
    sim_delayed_write(*r.sim, producer, pinned, fresh);
    tensor_spec s;
    s.device = {device_kind::cuda_host, 0};
    s.shape = {1024};
    s.data = pinned;
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.stream = reinterpret_cast<std::int64_t>(producer);
    if (!view) {
      o.target = host_device;
      o.copy = true;
    }
    absl::StatusOr<tensor> t = import_now(*r.rt, source, o);
    REQUIRE(t.ok());
    CHECK(t->is_view() == view);
    // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison): a copy is the same bytes
    CHECK(std::memcmp(t->data(), fresh.data(), 1024 * sizeof(float)) == 0);
    if (!view) CHECK(testing::released(count));
  }
  testing::finish_stream(*r.sim, 0, producer);
  r.sim->stream_destroy(producer);
  REQUIRE(r.sim->free_host(pinned) == cuda::error::success);
}

// Found by the import fuzzer: with a consumer stream, a copy that failed as
// it was enqueued resumed the caller with OK and a copy never made.
TEST_CASE("a producer stream that cannot be followed fails the import, consumer stream or not",
          "[cuda][import][stream]") {
  sim_runtime r = make_sim_runtime();
  std::vector<float> host(64, 2.0f);
  testing::device_memory mem(*r.sim, 1, host.data(), 256);
  cuda::stream_t consumer = nullptr;
  r.sim->set_device(0);
  REQUIRE(r.sim->stream_create(&consumer, cuda::stream_flags::non_blocking) ==
          cuda::error::success);
  int not_a_stream = 0;
  for (const bool view : {false, true}) {
    INFO((view ? "a view on cuda:1" : "a copy to cuda:0"));
    tensor_spec s;
    s.device = {device_kind::cuda, 1};
    s.shape = {64};
    s.data = mem.data;
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.stream = reinterpret_cast<std::int64_t>(&not_a_stream);
    o.target = device{device_kind::cuda, view ? 1 : 0};
    o.consumer_stream = reinterpret_cast<std::int64_t>(consumer);
    // Refused when the import is called, before the tensor is consumed.
    require_status(import_now(*r.rt, source, o).status(), absl::StatusCode::kInternal,
                   {"cannot follow the producer's stream", "cudaErrorInvalidResourceHandle",
                    "cuda:1", "not consumed"});
    CHECK(!source.empty());
    CHECK(count.calls == 0);
    // A GPU would not name the bad handle; the simulation reports it.
    const std::vector<std::string> reports = r.sim->take_reports();
    REQUIRE(!reports.empty());
    CHECK_THAT(reports.back(), Catch::Matchers::Contains("cudaEventRecord") &&
                                   Catch::Matchers::Contains("names no live stream"));
  }
  testing::finish_stream(*r.sim, 0, consumer);
  r.sim->stream_destroy(consumer);
}

TEST_CASE("an import follows the producer's stream without blocking on it",
          "[cuda][import][stream]") {
  sim_runtime r = make_sim_runtime();
  testing::scenario_producer_stream(*r.rt, 0, std::chrono::milliseconds(30));
}

TEST_CASE("with a consumer stream the import resumes at once and that stream waits",
          "[cuda][import][stream]") {
  sim_runtime r = make_sim_runtime();
  std::vector<float> stale(256, -1.0f);
  std::vector<float> fresh(256);
  std::iota(fresh.begin(), fresh.end(), 0.0f);
  testing::device_memory mem(*r.sim, 0, stale.data(), 1024);
  cuda::stream_t producer = nullptr;
  cuda::stream_t consumer = nullptr;
  r.sim->set_device(0);
  REQUIRE(r.sim->stream_create(&producer, cuda::stream_flags::non_blocking) ==
          cuda::error::success);
  r.sim->set_device(1);
  REQUIRE(r.sim->stream_create(&consumer, cuda::stream_flags::non_blocking) ==
          cuda::error::success);
  std::atomic<bool> written{false};
  REQUIRE(r.sim->launch_host_func(producer, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::memcpy(mem.data, fresh.data(), 1024);
    written = true;
  }) == cuda::error::success);

  for (const bool view : {false, true}) {
    INFO((view ? "a view on cuda:0" : "a copy to cuda:1"));
    tensor_spec s;
    s.device = {device_kind::cuda, 0};
    s.shape = {256};
    s.data = mem.data;
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.stream = reinterpret_cast<std::int64_t>(producer);
    o.consumer_stream = reinterpret_cast<std::int64_t>(view ? producer : consumer);
    if (!view) o.target = device{device_kind::cuda, 1};
    absl::StatusOr<tensor> t = import_now(*r.rt, source, o);
    REQUIRE(t.ok());
    if (!view) {
      CHECK_FALSE(written.load());  // resumed before the producer finished
      CHECK(count.calls == 0);      // the copy has not read the source yet
      // The caller's own work on its stream sees the final data.
      std::vector<float> seen(256);
      r.sim->set_device(1);
      REQUIRE(r.sim->memcpy_async(seen.data(), t->data(), 1024, cuda::memcpy_kind::device_to_host,
                                  consumer) == cuda::error::success);
      testing::finish_stream(*r.sim, 1, consumer);
      CHECK(seen == fresh);
      CHECK(testing::eventually([&] { return count.calls == 1; }));
    } else {
      CHECK(t->is_view());
      t = absl::UnknownError("dropped");
      CHECK(count.calls == 1);
    }
  }
  testing::require_status(
      [&] {
        tensor_spec s;
        s.shape = {4};
        s.data = stale.data();
        deleter_count count;
        managed_tensor source = make_tensor(s, count);
        import_options o;
        o.consumer_stream = 7;
        return import_now(*r.rt, source, o).status();
      }(),
      absl::StatusCode::kInvalidArgument, {"consumer_stream 7", "cpu:0", "GPU targets only"});
  testing::finish_stream(*r.sim, 0, producer);
  r.sim->stream_destroy(producer);
  r.sim->stream_destroy(consumer);
}

TEST_CASE("a large upload overlaps chunks on several streams and staging threads",
          "[cuda][import][pipeline]") {
  cuda::sim_options so;
  so.host_to_device_gbps = 1.0;  // 256 KiB chunks take about 0.25 ms each
  sim_runtime r = make_sim_runtime(so, 6, 256 << 10);
  std::vector<float> host(4 << 20 >> 2);  // 4 MiB, 16 chunks
  std::iota(host.begin(), host.end(), 0.0f);
  tensor_spec s;
  s.shape = {static_cast<std::int64_t>(host.size())};
  s.data = host.data();
  deleter_count count;
  managed_tensor source = make_tensor(s, count);
  import_options o;
  o.target = device{device_kind::cuda, 0};
  absl::StatusOr<tensor> t = import_now(*r.rt, source, o);
  REQUIRE(t.ok());
  CHECK(testing::released(count));
  CHECK(static_cast<const float*>(t->data())[host.size() - 1] ==
        static_cast<float>(host.size() - 1));
  const cuda::sim_stats st = r.sim->stats();
  CHECK(st.peak_busy_streams >= 2);
  CHECK(st.pageable_copies == 0);
  CHECK(st.async_copies >= 16);
}

TEST_CASE("a one-piece upload travels on the import's stream, a larger one on the staging streams",
          "[cuda][import][pipeline]") {
  sim_runtime r = make_sim_runtime();  // 4 chunks of 64 KiB
  auto calls_for = [&](std::int64_t side) {
    // A transposed side x side float32 source: gathered, then uploaded.
    std::vector<float> host(static_cast<std::size_t>(side * side));
    std::iota(host.begin(), host.end(), 0.0f);
    tensor_spec s;
    s.shape = {side, side};
    s.strides = std::vector<std::int64_t>{1, side};
    s.data = host.data();
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.target = device{device_kind::cuda, 0};
    const std::map<std::string, std::uint64_t> before = r.sim->call_counts();
    absl::StatusOr<tensor> t = import_now(*r.rt, source, o);
    std::map<std::string, std::uint64_t> calls = r.sim->call_counts();
    REQUIRE(t.ok());
    CHECK(testing::released(count));
    const auto* out = static_cast<const float*>(t->data());
    bool transposed = true;
    for (std::int64_t i = 0; i < side && transposed; ++i) {
      for (std::int64_t j = 0; j < side; ++j) {
        if (out[i * side + j] != host[static_cast<std::size_t>(j * side + i)]) transposed = false;
      }
    }
    CHECK(transposed);
    for (auto& [name, n] : calls) {
      auto it = before.find(name);
      if (it != before.end()) n -= it->second;
    }
    return calls;
  };

  // 1 KiB: one piece, one copy, no stream waits.
  std::map<std::string, std::uint64_t> small = calls_for(16);
  CHECK(small["cudaMemcpyAsync"] == 1);
  CHECK(small["cudaStreamWaitEvent"] == 0);
  // 1 MiB: 16 chunks over the staging streams, ordered after the import's
  // stream and it after them.
  std::map<std::string, std::uint64_t> large = calls_for(512);
  CHECK(large["cudaMemcpyAsync"] == 16);
  CHECK(large["cudaStreamWaitEvent"] >= 2);
}

TEST_CASE("an exhausted pinned pool makes imports wait, not fail", "[cuda][import][pipeline]") {
  sim_runtime r = make_sim_runtime({}, 1, 16 << 10);
  std::vector<std::vector<float>> data(6, std::vector<float>(40000, 1.5f));
  std::vector<std::future<absl::StatusOr<tensor>>> results;
  std::vector<deleter_count> counts(6);
  std::vector<managed_tensor> sources;
  for (int i = 0; i < 6; ++i) {
    tensor_spec s;
    s.shape = {40000};
    s.data = data[i].data();
    sources.push_back(make_tensor(s, counts[i]));
  }
  import_options o;
  o.target = device{device_kind::cuda, 1};
  for (auto& source : sources) {
    results.push_back(async_import_dlpack(*r.rt, source, o, asio::use_future));
  }
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<tensor> t = results[i].get();
    REQUIRE(t.ok());
    CHECK(static_cast<const float*>(t->data())[39999] == 1.5f);
    CHECK(testing::released(counts[i]));
  }
}

TEST_CASE("running out of GPU memory fails the import cleanly", "[cuda][import][fault]") {
  cuda::sim_options so;
  so.memory_per_device = 1 << 20;
  sim_runtime r = make_sim_runtime(so);
  std::vector<float> host(1 << 19);  // 2 MiB
  tensor_spec s;
  s.shape = {static_cast<std::int64_t>(host.size())};
  s.data = host.data();
  deleter_count count;
  managed_tensor source = make_tensor(s, count);
  import_options o;
  o.target = device{device_kind::cuda, 0};
  require_status(import_now(*r.rt, source, o).status(), absl::StatusCode::kResourceExhausted,
                 {"cudaMallocAsync", "cuda:0", "cudaErrorMemoryAllocation"});
  CHECK(testing::released(count));
  CHECK(testing::copy_budget(*r.rt).in_use() == 0);
}

TEST_CASE("a CUDA error mid-pipeline fails that import only, with the call named",
          "[cuda][import][fault]") {
  sim_runtime r = make_sim_runtime({}, 4, 16 << 10);
  std::vector<float> host(64 << 10);  // 256 KiB, 16 chunks
  tensor_spec s;
  s.shape = {static_cast<std::int64_t>(host.size())};
  s.data = host.data();
  import_options o;
  o.target = device{device_kind::cuda, 0};
  r.sim->fail_call("cudaMemcpyAsync", 3, cuda::error::launch_failure);
  deleter_count count;
  managed_tensor source = make_tensor(s, count);
  require_status(import_now(*r.rt, source, o).status(), absl::StatusCode::kInternal,
                 {"cudaMemcpyAsync", "cudaErrorLaunchFailure (719)"});
  CHECK(testing::released(count));

  deleter_count next;
  managed_tensor again = make_tensor(s, next);
  CHECK(import_now(*r.rt, again, o).ok());  // the runtime serves the next import
  CHECK(testing::released(next));
  CHECK(testing::eventually([&] { return r.sim->device_bytes_in_use(0) == 0; }));
}

TEST_CASE("a sticky CUDA error fails imports with its name instead of hanging",
          "[cuda][import][fault]") {
  sim_runtime r = make_sim_runtime();
  std::vector<float> host(1 << 16);
  tensor_spec s;
  s.shape = {static_cast<std::int64_t>(host.size())};
  s.data = host.data();
  import_options o;
  o.target = device{device_kind::cuda, 1};
  {
    INFO("a context failed before the import: refused up front, the tensor kept");
    r.sim->make_sticky(cuda::error::illegal_address);
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    require_status(
        import_now(*r.rt, source, o).status(), absl::StatusCode::kInternal,
        {"cannot tell where the data", "cudaPointerGetAttributes", "cudaErrorIllegalAddress"});
    CHECK_FALSE(source.empty());
    CHECK(count.calls == 0);
    source.reset();
    CHECK(count.calls == 1);
    r.sim->clear_faults();
  }
  {
    INFO("a context that fails once the tensor was consumed: the error, the deleter once");
    r.sim->fail_call("cudaMallocAsync", 1, cuda::error::illegal_address, true);
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    require_status(import_now(*r.rt, source, o).status(), absl::StatusCode::kInternal,
                   {"cudaMallocAsync", "cudaErrorIllegalAddress"});
    CHECK(source.empty());
    CHECK(testing::released(count));
    r.sim->clear_faults();
  }
  deleter_count next;
  managed_tensor again = make_tensor(s, next);
  CHECK(import_now(*r.rt, again, o).ok());
  CHECK(testing::released(next));
}

TEST_CASE("cancelling mid-pipeline stops the upload and releases everything",
          "[cuda][import][cancel]") {
  cuda::sim_options so;
  so.host_to_device_gbps = 0.25;  // 64 KiB chunks take about 0.26 ms each
  sim_runtime r = make_sim_runtime(so, 2, 64 << 10);
  std::vector<float> host(4 << 20 >> 2);  // 64 chunks: about 17 ms
  tensor_spec s;
  s.shape = {static_cast<std::int64_t>(host.size())};
  s.data = host.data();
  deleter_count count;
  managed_tensor source = make_tensor(s, count);
  import_options o;
  o.target = device{device_kind::cuda, 0};
  asio::io_context io;
  asio::cancellation_signal signal;
  absl::StatusOr<tensor> result;
  async_import_dlpack(*r.rt, source, o,
                      asio::bind_cancellation_slot(
                          signal.slot(), asio::bind_executor(io, [&](absl::StatusOr<tensor> t) {
                            result = std::move(t);
                          })));
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  signal.emit(asio::cancellation_type::terminal);
  io.run();
  require_status(result.status(), absl::StatusCode::kCancelled, {"during its copy"});
  CHECK(testing::released(count));
  CHECK(testing::eventually([&] { return r.sim->device_bytes_in_use(0) == 0; }));
}

TEST_CASE("1,000 concurrent GPU imports from several threads each complete once",
          "[cuda][import][load]") {
  sim_runtime r = make_sim_runtime({}, 4, 16 << 10);
  constexpr int threads = 4;
  constexpr int per_thread = 250;
  std::vector<float> host(6000);
  std::iota(host.begin(), host.end(), 0.0f);
  testing::device_memory mem(*r.sim, 1, host.data(), host.size() * 4);
  auto counts = std::make_unique<deleter_count[]>(threads * per_thread);
  std::atomic<int> ok{0};
  std::atomic<int> done{0};
  auto start = [&](int n, asio::io_context& io) {
    tensor_spec s;
    s.shape = {6000};
    // Uploads, downloads and device copies, mixed.
    s.data = n % 3 == 1 ? mem.data : host.data();
    if (n % 3 == 1) s.device = {device_kind::cuda, 1};
    import_options o;
    o.target = n % 3 == 0   ? device{device_kind::cuda, 0}
               : n % 3 == 1 ? host_device
                            : device{device_kind::cuda, 1};
    managed_tensor source = make_tensor(s, counts[n]);
    async_import_dlpack(*r.rt, source, o,
                        asio::bind_executor(io, [&](const absl::StatusOr<tensor>& result) {
                          ok += result.ok();
                          ++done;
                        }));
  };
  CHECK(testing::start_from_threads(threads, per_thread, start,
                                    [&] { return done.load() == threads * per_thread; }));
  CHECK(ok == threads * per_thread);
  r.rt->shutdown();  // every deleter has run
  int once = 0;
  for (int n = 0; n < threads * per_thread; ++n) once += counts[n].calls == 1;
  CHECK(once == threads * per_thread);
}

TEST_CASE("shutting down with GPU transfers in flight releases every tensor once",
          "[cuda][import][shutdown]") {
  cuda::sim_options so;
  so.host_to_device_gbps = 0.5;  // slow enough that transfers are in flight
  std::shared_ptr<cuda::sim_api> sim;
  std::vector<std::unique_ptr<deleter_count>> counts;
  std::vector<float> host(1 << 18);  // 1 MiB each
  asio::io_context io;
  std::atomic<int> finished{0};
  std::atomic<int> cancelled{0};
  {
    sim_runtime r = make_sim_runtime(so, 4, 64 << 10);
    sim = r.sim;
    for (int i = 0; i < 12; ++i) {
      counts.push_back(std::make_unique<deleter_count>());
      tensor_spec s;
      s.shape = {static_cast<std::int64_t>(host.size())};
      s.data = host.data();
      managed_tensor source = make_tensor(s, *counts.back());
      import_options o;
      o.target = device{device_kind::cuda, i % 2};
      async_import_dlpack(*r.rt, source, o,
                          asio::bind_executor(io, [&](const absl::StatusOr<tensor>& t) {
                            cancelled += t.status().code() == absl::StatusCode::kCancelled;
                            ++finished;
                          }));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }  // the runtime goes: every import is cancelled or finished by now
  for (const auto& c : counts) CHECK(c->calls == 1);
  io.run();
  CHECK(finished == 12);
  CHECK(cancelled > 0);
  CHECK(testing::eventually(
      [&] { return sim->device_bytes_in_use(0) == 0 && sim->device_bytes_in_use(1) == 0; }));
}

TEST_CASE("a pointer that lives elsewhere than its tensor claims is refused",
          "[cuda][import][locality]") {
  sim_runtime r = make_sim_runtime();
  std::vector<float> host(16, 1.0f);
  testing::device_memory on_zero(*r.sim, 0, host.data(), 64);
  tensor_spec s;
  s.shape = {16};
  s.data = on_zero.data;
  s.device = {device_kind::cuda, 1};
  deleter_count count;
  managed_tensor source = make_tensor(s, count);
  require_status(import_now(*r.rt, source, {}).status(), absl::StatusCode::kFailedPrecondition,
                 {"says it lives on cuda:1", "memory of cuda:0", "DLDevice"});
  CHECK_FALSE(source.empty());
  s.data = host.data();
  s.device = {device_kind::cuda, 0};
  managed_tensor pageable = make_tensor(s, count);
  require_status(import_now(*r.rt, pageable, {}).status(), absl::StatusCode::kFailedPrecondition,
                 {"not CUDA device memory"});
  CHECK(count.calls == 0);
  // A host tensor bound for a GPU whose pointer is GPU memory: refused too,
  // not gathered on the host.
  s.data = on_zero.data;
  s.device = host_device;
  managed_tensor lying = make_tensor(s, count);
  import_options o;
  o.target = device{device_kind::cuda, 1};
  require_status(import_now(*r.rt, lying, o).status(), absl::StatusCode::kFailedPrecondition,
                 {"says it lives on cpu:0", "memory of cuda:0"});
  CHECK_FALSE(lying.empty());
  CHECK(count.calls == 0);
}

}  // namespace dlasync

namespace dlasync {

TEST_CASE("a batch's copying members run asynchronously, each released once",
          "[cuda][import][batch]") {
  sim_runtime r = make_sim_runtime();
  std::vector<std::vector<float>> data(3, std::vector<float>(64 << 10));
  for (std::size_t i = 0; i < data.size(); ++i) {
    std::iota(data[i].begin(), data[i].end(), static_cast<float>(i));
  }
  std::vector<deleter_count> counts(3);
  std::vector<managed_tensor> sources;
  for (std::size_t i = 0; i < data.size(); ++i) {
    tensor_spec s;
    s.shape = {static_cast<std::int64_t>(data[i].size())};
    s.data = data[i].data();
    sources.push_back(make_tensor(s, counts[i]));
  }
  import_options o;
  o.target = device{device_kind::cuda, 1};
  std::vector<absl::StatusOr<tensor>> results =
      async_import_dlpack_batch(*r.rt, sources, o, asio::use_future).get();
  REQUIRE(results.size() == 3);
  for (std::size_t i = 0; i < results.size(); ++i) {
    INFO("member " << i);
    REQUIRE(results[i].ok());
    CHECK(results[i]->device() == *o.target);
    CHECK(std::memcmp(results[i]->data(), data[i].data(), data[i].size() * sizeof(float)) == 0);
    CHECK(sources[i].empty());
    CHECK(testing::released(counts[i]));
  }
}

TEST_CASE("cancelling a batch cancels the members still running", "[cuda][import][batch][cancel]") {
  cuda::sim_options so;
  so.host_to_device_gbps = 0.25;  // 1 MiB takes about 4 ms
  sim_runtime r = make_sim_runtime(so, 2, 64 << 10);
  std::vector<float> host(1 << 18);  // 1 MiB each
  std::vector<deleter_count> counts(4);
  std::vector<managed_tensor> sources;
  for (deleter_count& count : counts) {
    tensor_spec s;
    s.shape = {static_cast<std::int64_t>(host.size())};
    s.data = host.data();
    sources.push_back(make_tensor(s, count));
  }
  import_options o;
  o.target = device{device_kind::cuda, 0};
  asio::io_context io;
  asio::cancellation_signal signal;
  std::vector<absl::StatusOr<tensor>> results;
  async_import_dlpack_batch(
      *r.rt, sources, o,
      asio::bind_cancellation_slot(
          signal.slot(), asio::bind_executor(io, [&](std::vector<absl::StatusOr<tensor>> got) {
            results = std::move(got);
          })));
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  signal.emit(asio::cancellation_type::terminal);
  io.run();
  REQUIRE(results.size() == 4);
  int cancelled = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    INFO("member " << i << ": " << results[i].status().ToString());
    CHECK((results[i].ok() || results[i].status().code() == absl::StatusCode::kCancelled));
    cancelled += results[i].status().code() == absl::StatusCode::kCancelled;
    CHECK(testing::released(counts[i]));
  }
  CHECK(cancelled > 0);
  results.clear();
  CHECK(testing::eventually([&] { return r.sim->device_bytes_in_use(0) == 0; }));
}

}  // namespace dlasync
