// The staging pipeline on a simulated GPU, built on a CUDA context and a
// work pool of its own (no runtime): which uploads fit the chunks, uploads
// and downloads of more pieces than there are chunks (the chunks are
// reused), a cancellation midway, and faults of the simulated CUDA runtime
// surfacing as the transfer's status.
#include "transfer/src/copy/staging_pipeline.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"
#include "runtime/src/cuda/device_guard.hpp"
#include "runtime/src/handoff.hpp"
#include "support/runtime_fixture.hpp"
#include "support/test_tensors.hpp"
#include "transfer/copy/copy_rig.hpp"

namespace dlasync::detail {
namespace {

using namespace std::chrono_literals;
using testing::require_status;

constexpr std::uint64_t chunk_bytes = 4096;
constexpr int chunk_count = 2;
// 16 pieces of one chunk each through 2 chunks.
constexpr std::size_t total_bytes = 16 * chunk_bytes;

// Two chunks of 4 KiB on two simulated GPUs, with a pool of two workers.
struct staging_rig : testing::copy_rig {
  staging_rig() : copy_rig({.chunk_bytes = chunk_bytes, .chunks = chunk_count}) {}
};

std::vector<unsigned char> pattern(std::size_t bytes) {
  std::vector<unsigned char> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>(i * 7 + i / 251 + 1);
  return v;
}

copy_request compact_request(const void* from, void* to, std::size_t bytes) {
  copy_request r;
  r.from = from;
  r.to = to;
  r.bytes = bytes;
  r.compact = true;
  r.layout = strided_layout{1, {static_cast<std::int64_t>(bytes)}, {1}};
  r.control = std::make_shared<copy_control>();
  return r;
}

// Waits (30 s at most: a hang guard) for the pipeline and returns its status.
absl::Status finished(const staging_pipeline& p) {
  auto got = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> f = got->get_future();
  p.done()->on_complete([got](absl::Status s) { got->set_value(std::move(s)); });
  REQUIRE(f.wait_for(30s) == std::future_status::ready);
  return f.get();
}

}  // namespace

TEST_CASE("an upload of more pieces than chunks reuses the chunks and lands every byte",
          "[transfer][staging][cuda]") {
  staging_rig rig;
  SECTION("compact") {
    const std::vector<unsigned char> source = pattern(total_bytes);
    void* dst = rig.device_memory(total_bytes);
    auto p = staging_pipeline::upload(rig.context, rig.pool, 0,
                                      compact_request(source.data(), dst, total_bytes));
    p->start(rig.stream());
    REQUIRE(finished(*p).ok());
    CHECK(std::memcmp(dst, source.data(), total_bytes) == 0);
    CHECK(rig.sim->call_counts()["cudaMemcpyAsync"] == total_bytes / chunk_bytes);
    // Only the pool's two chunks were ever pinned, and all came back.
    CHECK(rig.sim->host_bytes_pinned() == chunk_count * chunk_bytes);
    CHECK(*rig.chunks_in_use == 0);
    rig.free_device_memory(dst);
  }
  SECTION("strided (a transpose gathered on the workers)") {
    constexpr std::int64_t rows = 64;
    constexpr std::int64_t cols = 256;
    std::vector<float> source(rows * cols);
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<float>(i);
    void* dst = rig.device_memory(source.size() * sizeof(float));
    copy_request r = compact_request(source.data(), dst, source.size() * sizeof(float));
    r.compact = false;
    r.layout = {4, {rows, cols}, {1, rows}};
    auto p = staging_pipeline::upload(rig.context, rig.pool, 0, r);
    p->start(rig.stream());
    REQUIRE(finished(*p).ok());
    const auto* out = static_cast<const float*>(dst);
    std::size_t wrong = 0;
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < cols; ++j) {
        wrong += out[i * cols + j] != source[static_cast<std::size_t>(i + j * rows)] ? 1 : 0;
      }
    }
    CHECK(wrong == 0);
    CHECK(rig.sim->call_counts()["cudaMemcpyAsync"] > static_cast<std::uint64_t>(chunk_count));
    CHECK(*rig.chunks_in_use == 0);
    rig.free_device_memory(dst);
  }
}

TEST_CASE("a download of more pieces than chunks reuses the chunks and lands every byte",
          "[transfer][staging][cuda]") {
  staging_rig rig;
  const std::vector<unsigned char> want = pattern(total_bytes);
  void* source = rig.device_memory(total_bytes);
  std::memcpy(source, want.data(), total_bytes);
  std::vector<unsigned char> out(total_bytes);
  auto p = staging_pipeline::download(rig.context, rig.pool, 0,
                                      compact_request(nullptr, out.data(), total_bytes), source);
  p->start(rig.stream());
  REQUIRE(finished(*p).ok());
  CHECK(out == want);
  CHECK(rig.sim->call_counts()["cudaMemcpyAsync"] == total_bytes / chunk_bytes);
  CHECK(rig.sim->host_bytes_pinned() == chunk_count * chunk_bytes);
  CHECK(*rig.chunks_in_use == 0);
  rig.free_device_memory(source);
}

TEST_CASE("a cancellation midway stops the upload and reports it aborted",
          "[transfer][staging][cuda]") {
  staging_rig rig;
  const std::vector<unsigned char> source = pattern(total_bytes);
  void* dst = rig.device_memory(total_bytes);
  copy_request r = compact_request(source.data(), dst, total_bytes);
  std::shared_ptr<copy_control> control = r.control;
  // The import's stream is held: the first two pieces (one per chunk) are
  // enqueued behind it, and nothing more can start until a chunk returns.
  cuda::stream_t after = rig.stream();
  std::promise<void> gate;
  {
    std::shared_future<void> opened = gate.get_future().share();
    absl::StatusOr<device_guard> on = device_guard::enter(*rig.sim, 0);
    REQUIRE(on.ok());
    REQUIRE(rig.sim->launch_host_func(after, [opened] { opened.wait(); }) == cuda::error::success);
  }
  auto p = staging_pipeline::upload(rig.context, rig.pool, 0, r);
  p->start(after);
  CHECK(rig.sim->call_counts()["cudaMemcpyAsync"] == chunk_count);
  control->cancel_requested = true;
  gate.set_value();
  // A cancellation is no error: the flag says the destination is partial.
  REQUIRE(finished(*p).ok());
  CHECK(control->aborted);
  CHECK(rig.sim->call_counts()["cudaMemcpyAsync"] == chunk_count);
  const std::size_t sent = chunk_count * chunk_bytes;
  CHECK(std::memcmp(dst, source.data(), sent) == 0);
  const std::vector<unsigned char> zeros(total_bytes - sent);
  CHECK(std::memcmp(static_cast<char*>(dst) + sent, zeros.data(), zeros.size()) == 0);
  CHECK(*rig.chunks_in_use == 0);
  rig.free_device_memory(dst);
}

TEST_CASE("a fault of the CUDA runtime surfaces as the transfer's status",
          "[transfer][staging][cuda]") {
  staging_rig rig;
  const std::vector<unsigned char> source = pattern(total_bytes);
  void* dst = rig.device_memory(total_bytes);
  std::shared_ptr<copy_control> control;
  SECTION("a copy that fails to enqueue") {
    rig.sim->fail_call("cudaMemcpyAsync", 3, cuda::error::launch_failure);
    copy_request r = compact_request(source.data(), dst, total_bytes);
    control = r.control;
    auto p = staging_pipeline::upload(rig.context, rig.pool, 0, r);
    p->start(rig.stream());
    require_status(finished(*p), absl::StatusCode::kInternal,
                   {"cudaMemcpyAsync", "cuda:0", "cudaErrorLaunchFailure"});
    // The pieces after the failure were given up, not sent.
    CHECK(rig.sim->call_counts()["cudaMemcpyAsync"] < total_bytes / chunk_bytes);
  }
  SECTION("chunks that cannot be pinned") {
    rig.sim->fail_call("cudaMallocHost", 1, cuda::error::memory_allocation);
    copy_request r = compact_request(source.data(), dst, total_bytes);
    control = r.control;
    auto p = staging_pipeline::upload(rig.context, rig.pool, 0, r);
    p->start(rig.stream());
    require_status(finished(*p), absl::StatusCode::kResourceExhausted,
                   {"cudaMallocHost", "cudaErrorMemoryAllocation"});
  }
  SECTION("staging streams that cannot be ordered after the import's stream") {
    rig.sim->fail_call("cudaStreamWaitEvent", 1, cuda::error::invalid_resource_handle);
    copy_request r = compact_request(source.data(), dst, total_bytes);
    control = r.control;
    auto p = staging_pipeline::upload(rig.context, rig.pool, 0, r);
    p->start(rig.stream());
    require_status(finished(*p), absl::StatusCode::kInternal,
                   {"cudaStreamWaitEvent", "cuda:0", "cudaErrorInvalidResourceHandle"});
    // Nothing was sent: a copy could have overtaken the import's stream.
    CHECK(rig.sim->call_counts()["cudaMemcpyAsync"] == 0);
  }
  SECTION("a piece whose completion cannot be tracked") {
    rig.sim->fail_call("cudaEventRecord", 4, cuda::error::unknown);
    copy_request r = compact_request(source.data(), dst, total_bytes);
    control = r.control;
    auto p = staging_pipeline::upload(rig.context, rig.pool, 0, r);
    p->start(rig.stream());
    require_status(finished(*p), absl::StatusCode::kInternal,
                   {"cudaEventRecord", "cuda:0", "cudaErrorUnknown"});
    // Its chunk goes back once its stream has run the copy, which may be
    // after the transfer reported.
    CHECK(testing::eventually([&] { return *rig.chunks_in_use == 0; }));
  }
  SECTION("a context that fails midway (sticky)") {
    rig.sim->fail_call("cudaMemcpyAsync", 3, cuda::error::illegal_address, true);
    std::vector<unsigned char> out(total_bytes);
    std::memcpy(dst, source.data(), total_bytes);
    copy_request r = compact_request(nullptr, out.data(), total_bytes);
    control = r.control;
    auto p = staging_pipeline::download(rig.context, rig.pool, 0, r, dst);
    p->start(rig.stream());
    // A sticky error is returned by every later call on every thread, so the
    // call that reports it first is a race: the copy that failed, or another
    // worker's next call. The status carries the error and the device either way.
    const absl::Status status = finished(*p);
    require_status(status, absl::StatusCode::kInternal,
                   {"failed on cuda:0", "cudaErrorIllegalAddress"});
    const std::string message(status.message());
    CHECK((message.rfind("cudaMemcpyAsync failed", 0) == 0 ||
           message.rfind("cudaSetDevice failed", 0) == 0 ||
           message.rfind("cudaEventRecord failed", 0) == 0 ||
           message.rfind("cudaStreamWaitEvent failed", 0) == 0));
    rig.sim->clear_faults();
  }
  CHECK_FALSE(control->aborted);
  CHECK(*rig.chunks_in_use == 0);
  rig.free_device_memory(dst);
}

}  // namespace dlasync::detail
