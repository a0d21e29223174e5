// Planted mistakes (runtime/src/planted.hpp): each test-only switch removes
// one ordering from a copy path, or breaks one CUDA rule, and the strict
// simulation must report it on every one of 100 runs, not by luck. Without
// the switch the same imports make no report.
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "runtime/sim/sim_api.hpp"
#include "runtime/src/planted.hpp"
#include "support/cuda_scenarios.hpp"
#include "support/runtime_fixture.hpp"

namespace dlasync {
namespace {

using detail::planted;
using testing::deleter_count;
using testing::make_tensor;
using testing::sim_runtime;
using testing::tensor_spec;

constexpr int runs = 100;

// Three planted mistakes are also data races on host memory in the
// simulation, whose device memory is host memory (the host and a copy, or
// two copies, touch the same bytes at once): ThreadSanitizer reports them
// itself and fails the run. Under it those tests say so and stop; the plain
// and ASan runs show the checker catching them.
#if defined(__SANITIZE_THREAD__)
constexpr bool thread_sanitizer = true;
#else
constexpr bool thread_sanitizer = false;
#endif

bool skipped_under_thread_sanitizer() {
  if (thread_sanitizer) {
    WARN("skipped under ThreadSanitizer: this planted mistake races on host memory");
  }
  return thread_sanitizer;
}

// Turns `m` on for the lifetime of the object.
struct planting {
  explicit planting(planted m) { detail::plant_mistakes(static_cast<unsigned>(m)); }
  ~planting() { detail::plant_mistakes(0); }
  planting(const planting&) = delete;
  planting& operator=(const planting&) = delete;
};

// Copies and kernels last 3 ms: long enough that work wrongly taken for
// finished is still running when the host acts on it.
sim_runtime slow_runtime() {
  cuda::sim_options so;
  so.min_op_us = 3000;
  return testing::make_sim_runtime(so, [](runtime_options& o) {
    o.staging_chunks = 2;
    o.staging_chunk_bytes = 16 << 10;
  });
}

// One import of a `shape` float32 tensor (transposed when `strided`) from
// `memory` on `source` to `target`, with the producer's stream if given;
// the tensor is dropped and its deleter awaited. Returns the import's
// status.
absl::Status import_once(sim_runtime& r, device source, void* memory, std::int64_t rows,
                         std::int64_t cols, bool strided, std::optional<device> target,
                         std::optional<std::int64_t> producer = std::nullopt) {
  tensor_spec s;
  s.device = source;
  s.shape = {rows, cols};
  if (strided) s.strides = std::vector<std::int64_t>{1, rows};
  s.data = memory;
  deleter_count count;
  managed_tensor t = make_tensor(s, count);
  import_options o;
  o.target = target;
  o.require_contiguous = true;
  o.stream = producer;
  absl::StatusOr<tensor> result = testing::import_now(*r.rt, t, o);
  absl::Status status = result.status();
  result = absl::UnknownError("dropped");
  REQUIRE(testing::eventually([&] { return count.calls == 1; }));
  return status;
}

// Runs `scenario` 100 times with `m` planted, requiring a report holding
// every one of `words` each time, then once without it, requiring none.
template <typename Scenario>
void caught_every_time(sim_runtime& r, planted m, std::initializer_list<const char*> words,
                       Scenario scenario) {
  int caught = 0;
  {
    planting on(m);
    for (int run = 0; run < runs; ++run) {
      scenario(run);
      const std::vector<std::string> reports = r.sim->take_reports();
      bool found = false;
      for (const std::string& report : reports) {
        bool all = true;
        for (const char* w : words) all = all && report.find(w) != std::string::npos;
        found = found || all;
      }
      if (!found) {
        for (const std::string& report : reports) UNSCOPED_INFO(report);
        FAIL_CHECK("run " << run << " of the planted mistake made no matching report");
      }
      caught += found ? 1 : 0;
      r.sim->clear_faults();
    }
  }
  CHECK(caught == runs);
  scenario(runs);
  CHECK(r.sim->take_reports().empty());
}

}  // namespace

TEST_CASE("planted: a copy that does not wait for the producer's stream is reported",
          "[cuda][planted]") {
  if (skipped_under_thread_sanitizer()) return;
  sim_runtime r = slow_runtime();
  std::vector<float> fresh(64 * 64);
  std::iota(fresh.begin(), fresh.end(), 0.0f);
  testing::device_memory mem(*r.sim, 0, fresh.data(), fresh.size() * sizeof(float));
  REQUIRE(r.sim->set_device(0) == cuda::error::success);
  cuda::stream_t producer = nullptr;
  REQUIRE(r.sim->stream_create(&producer, cuda::stream_flags::non_blocking) ==
          cuda::error::success);
  caught_every_time(
      r, planted::skip_producer_wait,
      {"race", "dlasyncGatherKernel", "reads", "while cudaMemcpyAsync (host to device"}, [&](int) {
        testing::slow_device_write write(*r.sim, producer, mem.data, fresh,
                                         std::chrono::milliseconds(20));
        CHECK(import_once(r, {device_kind::cuda, 0}, mem.data, 64, 64, true, std::nullopt,
                          reinterpret_cast<std::int64_t>(producer))
                  .ok());
        testing::finish_stream(*r.sim, 0, producer);
      });
  REQUIRE(r.sim->stream_destroy(producer) == cuda::error::success);
}

TEST_CASE("planted: staging streams that do not wait for the destination's allocation",
          "[cuda][planted]") {
  sim_runtime r = slow_runtime();
  // 256 KiB: 16 pieces over the two staging streams.
  std::vector<float> host(256 * 256, 1.0f);
  caught_every_time(r, planted::skip_staging_start_wait,
                    {"race", "cudaMemcpyAsync (host to device", "cudaMallocAsync"}, [&](int) {
                      CHECK(import_once(r, host_device, host.data(), 256, 256, false,
                                        device{device_kind::cuda, 0})
                                .ok());
                    });
}

TEST_CASE("planted: a staging chunk back in the pool while its upload reads it",
          "[cuda][planted]") {
  if (skipped_under_thread_sanitizer()) return;
  sim_runtime r = slow_runtime();
  std::vector<float> host(256 * 256, 1.0f);
  caught_every_time(r, planted::early_chunk_return,
                    {"race: the host releases", "a staging chunk goes back to the pool",
                     "cudaMemcpyAsync (host to device"},
                    [&](int) {
                      CHECK(import_once(r, host_device, host.data(), 256, 256, false,
                                        device{device_kind::cuda, 1})
                                .ok());
                    });
}

TEST_CASE("planted: a downloaded chunk copied out before its transfer completed",
          "[cuda][planted]") {
  if (skipped_under_thread_sanitizer()) return;
  sim_runtime r = slow_runtime();
  std::vector<float> host(64 * 64, 1.0f);
  testing::device_memory mem(*r.sim, 0, host.data(), host.size() * sizeof(float));
  caught_every_time(
      r, planted::early_chunk_read,
      {"race: the host reads", "the host copies a staging chunk out",
       "cudaMemcpyAsync (device to host"},
      [&](int) {
        (void)import_once(r, {device_kind::cuda, 0}, mem.data, 64, 64, false, host_device);
      });
}

TEST_CASE("planted: a failed download that reports before its gather has run", "[cuda][planted]") {
  sim_runtime r = slow_runtime();
  std::vector<float> host(64 * 64, 1.0f);
  testing::device_memory mem(*r.sim, 0, host.data(), host.size() * sizeof(float));
  caught_every_time(
      r, planted::skip_failure_drain,
      {"race: the host releases", "the DLPack deleter of the source", "dlasyncGatherKernel"},
      [&](int run) {
        // The first chunk's copy fails as it is enqueued, while the gather
        // that compacts the strided source is still running.
        if (run < runs) r.sim->fail_call("cudaMemcpyAsync", 1, cuda::error::launch_failure);
        const absl::Status st =
            import_once(r, {device_kind::cuda, 0}, mem.data, 64, 64, true, host_device);
        CHECK(st.ok() == (run == runs));
        // A failed import waits for nothing: let the streams run dry.
        testing::finish_stream(*r.sim, 0, testing::legacy_stream());
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      });
}

TEST_CASE("planted: a strided peer copy that frees its temporary before the copy",
          "[cuda][planted]") {
  sim_runtime r = slow_runtime();
  std::vector<float> host(64 * 64, 1.0f);
  testing::device_memory mem(*r.sim, 1, host.data(), host.size() * sizeof(float));
  caught_every_time(r, planted::early_temporary_free,
                    {"race: cudaFreeAsync", "frees", "cudaMemcpyAsync (device to device"},
                    [&](int) {
                      CHECK(import_once(r, {device_kind::cuda, 1}, mem.data, 64, 64, true,
                                        device{device_kind::cuda, 0})
                                .ok());
                    });
}

TEST_CASE("planted: an event recorded on another device's stream", "[cuda][planted]") {
  sim_runtime r = slow_runtime();
  std::vector<float> host(64 * 64, 1.0f);
  testing::device_memory mem(*r.sim, 1, host.data(), host.size() * sizeof(float));
  caught_every_time(r, planted::event_of_waiter_device,
                    {"rule: cudaEventRecord", "cudaErrorInvalidResourceHandle",
                     "record an event of the stream's device"},
                    [&](int run) {
                      const absl::Status st = import_once(r, {device_kind::cuda, 1}, mem.data, 64,
                                                          64, true, device{device_kind::cuda, 0});
                      CHECK(st.ok() == (run == runs));
                    });
}

TEST_CASE("planted: a gather launched without its device current", "[cuda][planted]") {
  sim_runtime r = slow_runtime();
  std::vector<float> host(64 * 64, 1.0f);
  testing::device_memory mem(*r.sim, 1, host.data(), host.size() * sizeof(float));
  caught_every_time(r, planted::launch_off_device,
                    {"rule: dlasyncGatherKernel", "cudaErrorInvalidResourceHandle",
                     "make the stream's device current"},
                    [&](int run) {
                      // The caller's thread has cuda:0 current; the gather
                      // runs on cuda:1.
                      REQUIRE(r.sim->set_device(0) == cuda::error::success);
                      const absl::Status st = import_once(r, {device_kind::cuda, 1}, mem.data, 64,
                                                          64, true, device{device_kind::cuda, 1});
                      CHECK(st.ok() == (run == runs));
                    });
}

}  // namespace dlasync
