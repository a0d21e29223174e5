// The GPU scenarios on a real GPU. Without one, the whole program reports
// itself skipped (exit status 77) with the reason, and CTest shows it as
// skipped. The check runs as the test run starts, from a listener, so that
// the program links Catch's prebuilt main like the others.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <cstdio>
#include <cstdlib>

#include "catch2/catch.hpp"
#include "support/cuda_rule_scenarios.hpp"

namespace dlasync {
namespace {

std::unique_ptr<runtime> real_runtime(std::uint64_t copy_budget = 0) {
  runtime_options o;
  o.topology = process_topology::single_process();
  o.copy_memory_budget = copy_budget;
  o.cuda = "real";
  absl::StatusOr<std::unique_ptr<runtime>> rt = runtime::create(std::move(o));
  REQUIRE(rt.ok());
  return *std::move(rt);
}

int gpu_count() {
  int n = 0;
  return testing::cuda_of(*real_runtime())->get_device_count(&n) == cuda::error::success ? n : 0;
}

// Ends the program with exit status 77 (skipped) before any test runs when
// the real CUDA runtime finds no device.
class gpu_presence : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testRunStarting(Catch::TestRunInfo const& /*info*/) override {
    absl::StatusOr<std::unique_ptr<cuda::api>> api = cuda::make_api("real", {});
    if (api.ok()) return;
    std::printf("skipped: the [gpu] tests need a CUDA device: %s\n",
                std::string(api.status().message()).c_str());
    std::fflush(stdout);
    std::exit(77);
  }
};

CATCH_REGISTER_LISTENER(gpu_presence)

}  // namespace

TEST_CASE("GPU: host tensors reach the GPU through pinned staging", "[gpu]") {
  testing::scenario_host_to_gpu(*real_runtime(), 0);
}

TEST_CASE("GPU: pageable host memory onto cuda_host lands in page-locked memory", "[gpu]") {
  testing::scenario_host_to_page_locked(*real_runtime(), 0);
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
  // The producer is slow on the device (a host function holds its stream
  // for 300 ms, then a copy from page-locked memory writes): a pageable
  // copy could make the host wait first, and test nothing.
  testing::scenario_producer_stream(*real_runtime(), 0, std::chrono::milliseconds(300));
}

TEST_CASE("GPU: a misaligned strided source is gathered with words it allows", "[gpu]") {
  testing::scenario_misaligned_gather(*real_runtime(), 0);
}

TEST_CASE("GPU: the gather's launch reports its own status, not an earlier error", "[gpu]") {
  testing::scenario_launch_after_failed_call(*real_runtime(), 0);
}

TEST_CASE("GPU: producer stream 2 is the importing thread's own", "[gpu]") {
  testing::scenario_per_thread_producer(*real_runtime(4096), 0, std::chrono::milliseconds(300));
}

}  // namespace dlasync
