// Builds without CUDA support: the real runtime is not there.
#include "runtime/src/cuda/real_cuda.hpp"

namespace dlasync::cuda {

absl::StatusOr<std::unique_ptr<api>> make_real_api() {
  return absl::UnavailableError(
      "this build has no CUDA support (configure with -DDLASYNC_WITH_CUDA=ON and a CUDA "
      "toolkit); use DLASYNC_CUDA=sim:N for simulated GPUs");
}

}  // namespace dlasync::cuda
