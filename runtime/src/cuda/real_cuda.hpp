// The real CUDA runtime behind the seam (internal), in builds with
// DLASYNC_WITH_CUDA; builds without it say why there is none.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/src/cuda/cuda_api.hpp"

namespace dlasync::cuda {

// The cudart-backed API; Unavailable when this build has no CUDA support or
// no device is usable (the message says which, with cudart's error).
absl::StatusOr<std::unique_ptr<api>> make_real_api();

}  // namespace dlasync::cuda
