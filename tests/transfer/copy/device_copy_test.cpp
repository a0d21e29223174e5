// The GPU copies on simulated GPUs (rules and race checks on), built on the
// copy engine's parts alone (copy_rig.hpp: a CUDA context on two simulated
// GPUs, a work pool, staging chunks of 4 KiB; no runtime). copy_on_gpu for compact and strided sources (the gather
// kernel), on one GPU and across two, following a producer's stream; its
// error paths; a strided download compacted on the GPU first. (The
// transfer plan refuses uploads whose rows do not fit a chunk.)
#include "transfer/src/copy/device_copy.hpp"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"
#include "runtime/src/cuda/device_guard.hpp"
#include "support/runtime_fixture.hpp"
#include "support/test_tensors.hpp"
#include "transfer/copy/copy_rig.hpp"

namespace dlasync::detail {
namespace {

using testing::require_status;

const device gpu0{device_kind::cuda, 0};
const device gpu1{device_kind::cuda, 1};

std::vector<float> iota_floats(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) + 0.5f;
  return v;
}

// A request to copy a `rows` x `cols` float tensor read as its transpose
// (strides {1, rows}) from `from` on `source` to `to` on `target`.
copy_request transposed(device source, device target, const void* from, void* to, std::int64_t rows,
                        std::int64_t cols) {
  copy_request r;
  r.path = source == target ? transfer_path::within_gpu : transfer_path::gpu_to_gpu;
  r.source = source;
  r.target = target;
  r.from = from;
  r.to = to;
  r.layout = {4, {rows, cols}, {1, rows}};
  r.bytes = static_cast<std::uint64_t>(rows * cols) * 4;
  r.control = std::make_shared<copy_control>();
  return r;
}

// How many elements of the compact `out` differ from the transpose of
// `in` (`rows` x `cols`).
std::size_t wrong_transpose(const void* out, const std::vector<float>& in, std::int64_t rows,
                            std::int64_t cols) {
  const auto* o = static_cast<const float*>(out);
  std::size_t wrong = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) {
      wrong += o[i * cols + j] != in[static_cast<std::size_t>(i + j * rows)] ? 1 : 0;
    }
  }
  return wrong;
}

}  // namespace

TEST_CASE("copy_on_gpu copies a compact source with one copy", "[transfer][copy][cuda]") {
  testing::copy_rig r;
  const copy_services with = r.services();
  const std::vector<float> data = iota_floats(1000);
  const std::size_t bytes = data.size() * sizeof(float);
  void* src = r.device_memory(bytes, 0, data.data());
  void* dst = r.device_memory(bytes, 0);
  copy_request req = transposed(gpu0, gpu0, src, dst, 1000, 1);
  req.layout = {4, {1000}, {1}};
  req.compact = true;
  const std::uint64_t kernels_before = r.sim->call_counts()["dlasyncGatherKernel"];
  REQUIRE(testing::finished(copy_on_gpu(with, {gpu0, 0}, req)).ok());
  CHECK(std::memcmp(dst, data.data(), bytes) == 0);
  CHECK(r.sim->call_counts()["dlasyncGatherKernel"] == kernels_before);
  REQUIRE(r.sim->free_device(src) == cuda::error::success);
  REQUIRE(r.sim->free_device(dst) == cuda::error::success);
}

TEST_CASE("copy_on_gpu gathers a strided source with the kernel, on its GPU or across",
          "[transfer][copy][cuda]") {
  testing::copy_rig r;
  const copy_services with = r.services();
  constexpr std::int64_t rows = 48;
  constexpr std::int64_t cols = 20;
  const std::vector<float> data = iota_floats(rows * cols);
  const std::size_t bytes = data.size() * sizeof(float);
  SECTION("on the source's GPU") {
    void* src = r.device_memory(bytes, 1, data.data());
    void* dst = r.device_memory(bytes, 1);
    REQUIRE(testing::finished(
                copy_on_gpu(with, {gpu1, 1}, transposed(gpu1, gpu1, src, dst, rows, cols)))
                .ok());
    CHECK(wrong_transpose(dst, data, rows, cols) == 0);
    CHECK(r.sim->call_counts()["dlasyncGatherKernel"] == 1);
    REQUIRE(r.sim->free_device(src) == cuda::error::success);
    REQUIRE(r.sim->free_device(dst) == cuda::error::success);
  }
  SECTION("compacted on the source GPU, then copied across") {
    void* src = r.device_memory(bytes, 1, data.data());
    void* dst = r.device_memory(bytes, 0);
    const std::uint64_t on_source = r.sim->device_bytes_in_use(1);
    REQUIRE(testing::finished(
                copy_on_gpu(with, {gpu0, 0}, transposed(gpu1, gpu0, src, dst, rows, cols)))
                .ok());
    CHECK(wrong_transpose(dst, data, rows, cols) == 0);
    CHECK(r.sim->call_counts()["dlasyncGatherKernel"] == 1);
    // The temporary on the source GPU is freed once the copy has read it.
    CHECK(testing::eventually([&] { return r.sim->device_bytes_in_use(1) == on_source; }));
    REQUIRE(r.sim->free_device(src) == cuda::error::success);
    REQUIRE(r.sim->free_device(dst) == cuda::error::success);
  }
}

TEST_CASE("copy_on_gpu reads the source only after the producer's stream got there",
          "[transfer][copy][cuda]") {
  testing::copy_rig r;
  const copy_services with = r.services();
  const std::shared_ptr<cuda_context>& context = r.context;
  const std::vector<float> data = iota_floats(512);
  const std::size_t bytes = data.size() * sizeof(float);
  void* filled = r.device_memory(bytes, 0, data.data());
  void* src = r.device_memory(bytes, 0);
  void* dst = r.device_memory(bytes, 0);
  // The producer's stream fills the source once its gate opens (from device
  // memory: a copy from pageable memory would hold this thread until then).
  cuda::stream_t producer = nullptr;
  std::promise<void> gate;
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*r.sim, 0);
    REQUIRE(on.ok());
    REQUIRE(r.sim->stream_create(&producer) == cuda::error::success);
    std::shared_future<void> opened = gate.get_future().share();
    REQUIRE(r.sim->launch_host_func(producer, [opened] { opened.wait(); }) == cuda::error::success);
    REQUIRE(r.sim->memcpy_async(src, filled, bytes, cuda::memcpy_kind::device_to_device,
                                producer) == cuda::error::success);
  }
  copy_request req = transposed(gpu0, gpu0, src, dst, 512, 1);
  req.layout = {4, {512}, {1}};
  req.compact = true;
  req.produced = context->record_producer(0, reinterpret_cast<std::int64_t>(producer));
  marker_ptr copied = copy_on_gpu(with, {gpu0, 0}, req);
  context->quiesce();
  CHECK_FALSE(copied->done());
  gate.set_value();
  REQUIRE(testing::finished(copied).ok());
  CHECK(std::memcmp(dst, data.data(), bytes) == 0);
  REQUIRE(testing::finished(req.produced).ok());
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*r.sim, 0);
    REQUIRE(r.sim->stream_destroy(producer) == cuda::error::success);
  }
  REQUIRE(r.sim->free_device(filled) == cuda::error::success);
  REQUIRE(r.sim->free_device(src) == cuda::error::success);
  REQUIRE(r.sim->free_device(dst) == cuda::error::success);
}

TEST_CASE("copy_on_gpu reports a failed copy, kernel or producer as its status",
          "[transfer][copy][cuda]") {
  testing::copy_rig r;
  const copy_services with = r.services();
  constexpr std::int64_t rows = 16;
  constexpr std::int64_t cols = 8;
  const std::vector<float> data = iota_floats(rows * cols);
  const std::size_t bytes = data.size() * sizeof(float);
  void* src = r.device_memory(bytes, 0, data.data());
  void* dst = r.device_memory(bytes, 0);
  copy_request compact = transposed(gpu0, gpu0, src, dst, rows * cols, 1);
  compact.layout = {4, {rows * cols}, {1}};
  compact.compact = true;
  SECTION("a copy that cannot be enqueued") {
    r.sim->fail_call("cudaMemcpyAsync", 1, cuda::error::launch_failure);
    require_status(testing::finished(copy_on_gpu(with, {gpu0, 0}, compact)),
                   absl::StatusCode::kInternal,
                   {"cudaMemcpyAsync", "cuda:0", "cudaErrorLaunchFailure"});
  }
  SECTION("a gather kernel that cannot be launched") {
    r.sim->fail_call("dlasyncGatherKernel", 1, cuda::error::launch_failure);
    require_status(testing::finished(
                       copy_on_gpu(with, {gpu0, 0}, transposed(gpu0, gpu0, src, dst, rows, cols))),
                   absl::StatusCode::kInternal,
                   {"dlasync gather kernel", "cuda:0", "cudaErrorLaunchFailure"});
  }
  SECTION("a marker for the copy that cannot be recorded") {
    r.sim->fail_call("cudaEventRecord", 1, cuda::error::unknown);
    require_status(testing::finished(copy_on_gpu(with, {gpu0, 0}, compact)),
                   absl::StatusCode::kInternal, {"cudaEventRecord", "cuda:0", "cudaErrorUnknown"});
  }
  SECTION("a producer whose stream could not be recorded: nothing is enqueued") {
    compact.produced = done_marker(absl::InternalError("cudaEventRecord failed on cuda:0"));
    const std::uint64_t copies = r.sim->call_counts()["cudaMemcpyAsync"];
    require_status(testing::finished(copy_on_gpu(with, {gpu0, 0}, compact)),
                   absl::StatusCode::kInternal, {"cudaEventRecord"});
    CHECK(r.sim->call_counts()["cudaMemcpyAsync"] == copies);
  }
  REQUIRE(r.sim->free_device(src) == cuda::error::success);
  REQUIRE(r.sim->free_device(dst) == cuda::error::success);
}

TEST_CASE("copy_on_gpu of no bytes completes without a copy", "[transfer][copy][cuda]") {
  testing::copy_rig r;
  const copy_services with = r.services();
  copy_request req;
  req.path = transfer_path::within_gpu;
  req.source = gpu0;
  req.target = gpu0;
  req.layout = {4, {0}, {1}};
  req.compact = true;
  const std::uint64_t copies = r.sim->call_counts()["cudaMemcpyAsync"];
  REQUIRE(testing::finished(copy_on_gpu(with, {gpu0, 0}, req)).ok());
  CHECK(r.sim->call_counts()["cudaMemcpyAsync"] == copies);
}

TEST_CASE("a strided download is compacted on its GPU, then staged to the host",
          "[transfer][copy][cuda][staging]") {
  testing::copy_rig r;
  const copy_services with = r.services();
  constexpr std::int64_t rows = 64;
  constexpr std::int64_t cols = 128;  // 32 KiB: 8 pieces through 4 KiB chunks
  const std::vector<float> data = iota_floats(rows * cols);
  void* src = r.device_memory(data.size() * sizeof(float), 1, data.data());
  std::vector<float> out(data.size());
  copy_request req = transposed(gpu1, device{device_kind::cpu, 0}, src, out.data(), rows, cols);
  req.path = transfer_path::gpu_to_host;
  const std::uint64_t on_gpu = r.sim->device_bytes_in_use(1);
  REQUIRE(testing::finished(download_through_staging(with, {gpu1, 0}, req)).ok());
  CHECK(wrong_transpose(out.data(), data, rows, cols) == 0);
  CHECK(r.sim->call_counts()["dlasyncGatherKernel"] == 1);
  // The compact temporary goes once the download has read it.
  CHECK(testing::eventually([&] { return r.sim->device_bytes_in_use(1) == on_gpu; }));
  REQUIRE(r.sim->free_device(src) == cuda::error::success);
}

}  // namespace dlasync::detail
