#include "runtime/src/cuda/cuda_api.hpp"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/sim/sim_api.hpp"
#include "runtime/src/cuda/real_cuda.hpp"

namespace dlasync::cuda {

std::string error_name(error e) {
  switch (e) {
    case error::success: return "cudaSuccess";
    case error::invalid_value: return "cudaErrorInvalidValue";
    case error::memory_allocation: return "cudaErrorMemoryAllocation";
    case error::initialization_error: return "cudaErrorInitializationError";
    case error::insufficient_driver: return "cudaErrorInsufficientDriver";
    case error::no_device: return "cudaErrorNoDevice";
    case error::invalid_device: return "cudaErrorInvalidDevice";
    case error::invalid_resource_handle: return "cudaErrorInvalidResourceHandle";
    case error::not_ready: return "cudaErrorNotReady";
    case error::illegal_address: return "cudaErrorIllegalAddress";
    case error::peer_access_already_enabled: return "cudaErrorPeerAccessAlreadyEnabled";
    case error::peer_access_not_enabled: return "cudaErrorPeerAccessNotEnabled";
    case error::misaligned_address: return "cudaErrorMisalignedAddress";
    case error::launch_failure: return "cudaErrorLaunchFailure";
    case error::peer_access_unsupported: return "cudaErrorPeerAccessUnsupported";
    case error::not_supported: return "cudaErrorNotSupported";
    case error::unknown: return "cudaErrorUnknown";
  }
  return absl::StrCat("cudaError ", static_cast<int>(e));
}

absl::Status to_status(error e, const char* call, int device) {
  const std::string message =
      absl::StrCat(call, " failed", device >= 0 ? absl::StrCat(" on cuda:", device) : "", ": ",
                   error_name(e), " (", static_cast<int>(e), ")");
  switch (e) {
    case error::memory_allocation: return absl::ResourceExhaustedError(message);
    case error::insufficient_driver:
    case error::no_device:
    case error::initialization_error: return absl::UnavailableError(message);
    case error::invalid_value:
    case error::invalid_device: return absl::InvalidArgumentError(message);
    default: return absl::InternalError(message);
  }
}

absl::StatusOr<std::unique_ptr<api>> make_api(const std::string& mode,
                                              const simulated_gpu_options& simulation) {
  if (mode == "off") return std::unique_ptr<api>();
  if (mode == "sim" || absl::StartsWith(mode, "sim:")) {
    sim_options o;
    o.memory_per_device = simulation.memory_per_device;
    o.host_to_device_gbps = simulation.host_to_device_gbps;
    o.device_to_host_gbps = simulation.device_to_host_gbps;
    o.device_to_device_gbps = simulation.device_to_device_gbps;
    o.device_reuse_bytes = simulation.device_reuse_bytes;
    o.print_reports = true;
    if (mode != "sim" &&
        (!absl::SimpleAtoi(mode.substr(4), &o.devices) || o.devices < 1 || o.devices > 64)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA mode \"", mode, "\" names no simulated GPU count in [1, 64]; use e.g. \"sim:2\""));
    }
    return std::unique_ptr<api>(std::make_unique<sim_api>(o));
  }
  if (mode == "real" || mode == "auto" || mode.empty()) {
    absl::StatusOr<std::unique_ptr<api>> real = make_real_api();
    if (real.ok() || mode == "real") return real;
    return std::unique_ptr<api>();  // auto: no usable CUDA
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "CUDA mode \"", mode, "\" is not one of off, auto, real, sim, sim:N (DLASYNC_CUDA)"));
}

}  // namespace dlasync::cuda
