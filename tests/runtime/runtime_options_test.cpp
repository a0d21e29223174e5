// runtime::create refuses every option outside its range with
// InvalidArgument, naming the option, the value seen and the range; the
// bounds themselves pass.
#include "dlasync/runtime.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

#include "catch2/catch.hpp"
#include "runtime/src/runtime_core.hpp"
#include "support/copy_budget.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

runtime_options base() {
  runtime_options o;
  o.topology = process_topology::single_process();
  o.worker_threads = 1;
  o.cuda = "off";
  return o;
}

void refused(const runtime_options& o, std::initializer_list<const char*> words) {
  testing::require_status(runtime::create(o).status(), absl::StatusCode::kInvalidArgument, words);
}

bool accepted(const runtime_options& o) {
  return detail::check_options(o).ok();
}

// `field` (named `name`) is refused just outside [low, high], naming itself,
// the value and `range`, and accepted at both ends. `cuda` is the mode the
// runtime is asked for.
template <typename T>
void check_range(T runtime_options::*field, const char* name, T low, T high, const char* range,
                 const char* cuda = "off") {
  runtime_options o = base();
  o.cuda = cuda;
  if (low > std::numeric_limits<T>::min()) {
    o.*field = low - 1;
    const std::string seen = absl::StrCat("runtime_options::", name, " is ", low - 1);
    refused(o, {seen.c_str(), range});
  }
  if (high < std::numeric_limits<T>::max()) {
    o.*field = high + 1;
    const std::string seen = absl::StrCat("runtime_options::", name, " is ", high + 1);
    refused(o, {seen.c_str(), range});
  }
  o.*field = low;
  CHECK(accepted(o));
  o.*field = high;
  CHECK(accepted(o));
}

constexpr std::uint64_t most = std::numeric_limits<std::uint64_t>::max();

}  // namespace

TEST_CASE("executor_threads outside [1, 1024] is refused", "[runtime][options]") {
  check_range(&runtime_options::executor_threads, "executor_threads", 1, 1024, "[1, 1024]");
}

TEST_CASE("worker_threads outside [0, 1024] is refused", "[runtime][options]") {
  check_range(&runtime_options::worker_threads, "worker_threads", 0, 1024,
              "one per hardware thread");
}

TEST_CASE("host_devices outside [0, 1024] is refused", "[runtime][options]") {
  check_range(&runtime_options::host_devices, "host_devices", 0, 1024, "the topology's count");
}

TEST_CASE("streams_per_device outside [1, 64] is refused", "[runtime][options]") {
  check_range(&runtime_options::streams_per_device, "streams_per_device", 1, 64, "[1, 64]");
}

TEST_CASE("parallel_copy_bytes below 4096 is refused", "[runtime][options]") {
  check_range(&runtime_options::parallel_copy_bytes, "parallel_copy_bytes", std::uint64_t{4096},
              most, "at least 4096");
  runtime_options o = base();
  o.parallel_copy_bytes = 0;
  refused(o, {"runtime_options::parallel_copy_bytes is 0"});
}

TEST_CASE("inline_copy_bytes above 64 MiB is refused", "[runtime][options]") {
  check_range(&runtime_options::inline_copy_bytes, "inline_copy_bytes", std::uint64_t{0},
              std::uint64_t{64} << 20, "hold the caller's thread");
}

TEST_CASE("copy_helper_linger outside [0, 10 ms] is refused", "[runtime][options]") {
  runtime_options o = base();
  o.copy_helper_linger = std::chrono::microseconds(-1);
  refused(o, {"runtime_options::copy_helper_linger is -1 microseconds", "[0, 10000]",
              "0 turns lingering off"});
  o.copy_helper_linger = std::chrono::microseconds(10'001);
  refused(o, {"runtime_options::copy_helper_linger is 10001 microseconds", "[0, 10000]"});
  for (const auto us : {0, 1, 200, 10'000}) {
    o.copy_helper_linger = std::chrono::microseconds(us);
    CHECK(accepted(o));
  }
}

TEST_CASE("the copy budget and the host cache take every value", "[runtime][options]") {
  runtime_options o = base();
  for (const std::uint64_t v : {std::uint64_t{0}, std::uint64_t{1}, most}) {
    o.copy_memory_budget = v;
    o.host_cache_bytes = v;
    CHECK(accepted(o));
  }
  o.copy_memory_budget = 1;
  o.host_cache_bytes = 0;
  absl::StatusOr<std::unique_ptr<runtime>> rt = runtime::create(o);
  REQUIRE(rt.ok());
  CHECK(testing::copy_budget(**rt).limit() == 1);
}

TEST_CASE("staging_chunk_bytes outside [4096, 1 GiB] is refused", "[runtime][options]") {
  check_range(&runtime_options::staging_chunk_bytes, "staging_chunk_bytes", std::uint64_t{4096},
              std::uint64_t{1} << 30, "[4096, 1073741824]", "sim:1");
  runtime_options o = base();
  o.cuda = "sim:1";
  o.staging_chunk_bytes = 0;  // once looped forever on a download
  refused(o, {"runtime_options::staging_chunk_bytes is 0"});
}

TEST_CASE("staging_chunks outside [1, 1024] is refused", "[runtime][options]") {
  check_range(&runtime_options::staging_chunks, "staging_chunks", 1, 1024, "[1, 1024]", "sim:1");
  runtime_options o = base();
  o.cuda = "sim:1";
  o.staging_chunks = -1;  // once hung the import and shutdown
  refused(o, {"runtime_options::staging_chunks is -1"});
}

TEST_CASE("staging_streams outside [1, 64] is refused", "[runtime][options]") {
  check_range(&runtime_options::staging_streams, "staging_streams", 1, 64, "[1, 64]", "sim:1");
}

TEST_CASE("a CUDA mode that names nothing is refused", "[runtime][options]") {
  runtime_options o = base();
  o.cuda = "gpu please";
  refused(o, {"CUDA mode \"gpu please\"", "off, auto, real, sim, sim:N"});
  o.cuda = "sim:0";
  refused(o, {"\"sim:0\"", "[1, 64]"});
  o.cuda = "sim:65";
  refused(o, {"\"sim:65\""});
}

TEST_CASE("simulated GPUs without memory or with a rate that is no rate are refused",
          "[runtime][options]") {
  runtime_options o = base();
  o.cuda = "sim:1";
  o.simulation.memory_per_device = 0;
  refused(o, {"runtime_options::simulation.memory_per_device is 0", "at least 1"});
  o.simulation.memory_per_device = 1 << 20;
  for (const double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity(), 2e6}) {
    INFO("rate " << bad);
    o.simulation.host_to_device_gbps = bad;
    refused(o, {"simulation.host_to_device_gbps", "more than 0 and at most 1e6"});
    o.simulation.host_to_device_gbps = 25;
    o.simulation.device_to_host_gbps = bad;
    refused(o, {"simulation.device_to_host_gbps"});
    o.simulation.device_to_host_gbps = 25;
    o.simulation.device_to_device_gbps = bad;
    refused(o, {"simulation.device_to_device_gbps"});
    o.simulation.device_to_device_gbps = 400;
  }
  absl::StatusOr<std::unique_ptr<runtime>> rt = runtime::create(o);
  REQUIRE(rt.ok());
  CHECK((*rt)->is_simulated({device_kind::cuda, 0}));
}

TEST_CASE("a topology that contradicts itself is refused", "[runtime][options]") {
  runtime_options o = base();
  o.topology->rank = 3;
  refused(o, {"rank 3"});
}

}  // namespace dlasync
