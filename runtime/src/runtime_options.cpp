// The checks runtime::create makes of its options, one range per field.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/src/runtime_core.hpp"
#include "runtime/src/status_macros.hpp"

namespace dlasync::detail {
namespace {

template <typename T>
absl::Status in_range(const char* field, T value, T low, T high, const char* note = "") {
  if (value >= low && value <= high) return absl::OkStatus();
  const std::string range = high == std::numeric_limits<T>::max()
                                ? absl::StrCat("at least ", low)
                                : absl::StrCat("in [", low, ", ", high, "]");
  return absl::InvalidArgumentError(
      absl::StrCat("runtime_options::", field, " is ", value, "; it must be ", range, note));
}

absl::Status rate(const char* field, double gbps) {
  if (std::isfinite(gbps) && gbps > 0 && gbps <= 1e6) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("runtime_options::simulation.", field, " is ",
                                                 gbps,
                                                 " GB/s; it must be more than 0 and at most "
                                                 "1e6"));
}

absl::Status linger(std::chrono::microseconds linger) {
  if (linger.count() >= 0 && linger.count() <= 10'000) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("runtime_options::copy_helper_linger is ", linger.count(),
                   " microseconds; it must be in [0, 10000] (0 turns lingering off): a "
                   "lingering worker keeps its core busy"));
}

constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = kib * 1024;
constexpr std::uint64_t gib = mib * 1024;
constexpr std::uint64_t no_limit = std::numeric_limits<std::uint64_t>::max();

}  // namespace

absl::Status check_options(const runtime_options& o) {
  DLASYNC_RETURN_IF_ERROR(in_range("executor_threads", o.executor_threads, 1, 1024));
  DLASYNC_RETURN_IF_ERROR(
      in_range("worker_threads", o.worker_threads, 0, 1024, " (0: one per hardware thread)"));
  DLASYNC_RETURN_IF_ERROR(
      in_range("host_devices", o.host_devices, 0, max_host_devices, " (0: the topology's count)"));
  DLASYNC_RETURN_IF_ERROR(in_range("streams_per_device", o.streams_per_device, 1, 64));
  DLASYNC_RETURN_IF_ERROR(in_range("parallel_copy_bytes", o.parallel_copy_bytes, 4 * kib, no_limit,
                                   ": smaller parts cost more to hand out than to copy"));
  DLASYNC_RETURN_IF_ERROR(in_range("inline_copy_bytes", o.inline_copy_bytes, std::uint64_t{0},
                                   64 * mib, ": a larger copy would hold the caller's thread"));
  DLASYNC_RETURN_IF_ERROR(linger(o.copy_helper_linger));
  DLASYNC_RETURN_IF_ERROR(in_range("staging_chunk_bytes", o.staging_chunk_bytes, 4 * kib, gib));
  DLASYNC_RETURN_IF_ERROR(in_range("staging_chunks", o.staging_chunks, 1, 1024));
  DLASYNC_RETURN_IF_ERROR(in_range("staging_streams", o.staging_streams, 1, 64));
  const simulated_gpu_options& sim = o.simulation;
  DLASYNC_RETURN_IF_ERROR(
      in_range("simulation.memory_per_device", sim.memory_per_device, std::uint64_t{1}, no_limit));
  DLASYNC_RETURN_IF_ERROR(rate("host_to_device_gbps", sim.host_to_device_gbps));
  DLASYNC_RETURN_IF_ERROR(rate("device_to_host_gbps", sim.device_to_host_gbps));
  DLASYNC_RETURN_IF_ERROR(rate("device_to_device_gbps", sim.device_to_device_gbps));
  return absl::OkStatus();
}

}  // namespace dlasync::detail
