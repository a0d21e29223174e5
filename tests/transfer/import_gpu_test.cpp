// The GPU scenarios on a real GPU. Without one, the whole program reports
// itself skipped (exit status 77) with the reason, and CTest shows it as
// skipped.
#define CATCH_CONFIG_RUNNER
#include <cstdio>

#include "catch2/catch.hpp"
#include "support/cuda_scenarios.hpp"

namespace dlasync {
namespace {

std::unique_ptr<runtime> real_runtime() {
  runtime_options o;
  o.topology = process_topology::single_process();
  o.cuda = "real";
  absl::StatusOr<std::unique_ptr<runtime>> rt = runtime::create(std::move(o));
  REQUIRE(rt.ok());
  return *std::move(rt);
}

int gpu_count() {
  int n = 0;
  return testing::cuda_of(*real_runtime())->get_device_count(&n) == cuda::error::success ? n : 0;
}

}  // namespace

TEST_CASE("GPU: host tensors reach the GPU through pinned staging", "[gpu]") {
  testing::scenario_host_to_gpu(*real_runtime(), 0);
}

TEST_CASE("GPU: GPU tensors come back to the host", "[gpu]") {
  std::unique_ptr<runtime> rt = real_runtime();
  testing::scenario_gpu_to_host(*rt, 0);
  testing::scenario_gpu_layouts_to_host(*rt, 0);
}

TEST_CASE("GPU: GPU tensors are viewed, copied, compacted and moved", "[gpu]") {
  std::unique_ptr<runtime> rt = real_runtime();
  testing::scenario_gpu_to_gpu(*rt, 0, gpu_count() > 1 ? 1 : 0);
}

TEST_CASE("GPU: managed memory is viewed in place and copied out", "[gpu]") {
  std::unique_ptr<runtime> rt = real_runtime();
  testing::scenario_managed(*rt, 0, gpu_count() > 1 ? 1 : 0);
}

TEST_CASE("GPU: an import follows the producer's stream", "[gpu]") {
  std::unique_ptr<runtime> rt = real_runtime();
  cuda::api& api = *testing::cuda_of(*rt);
  // A long device-to-device copy on the producer's stream, then the write:
  // the import has to wait for both.
  void* scratch = nullptr;
  const std::size_t big = std::size_t{1} << 30;
  api.set_device(0);
  REQUIRE(api.malloc_async(&scratch, 2 * big, testing::legacy_stream()) == cuda::error::success);
  testing::scenario_producer_stream(
      *rt, 0, [&](cuda::stream_t producer, void* dst, const std::vector<float>& values) {
        REQUIRE(api.memcpy_async(static_cast<char*>(scratch) + big, scratch, big,
                                 cuda::memcpy_kind::device_to_device,
                                 producer) == cuda::error::success);
        REQUIRE(api.memcpy_async(dst, values.data(), values.size() * sizeof(float),
                                 cuda::memcpy_kind::host_to_device,
                                 producer) == cuda::error::success);
      });
  api.free_async(scratch, testing::legacy_stream());
  testing::finish_stream(api, 0, testing::legacy_stream());
}

}  // namespace dlasync

int main(int argc, char** argv) {
  absl::StatusOr<std::unique_ptr<dlasync::cuda::api>> api = dlasync::cuda::make_api("real", {});
  if (!api.ok()) {
    std::printf("skipped: the [gpu] tests need a CUDA device: %s\n",
                std::string(api.status().message()).c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
