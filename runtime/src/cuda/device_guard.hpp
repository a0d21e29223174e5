// `device_guard` (internal) makes a CUDA device current on the calling
// thread for its lifetime and then restores the thread's CUDA state as it
// was: the context that was current before, or none (cuCtxSetCurrent). The
// current device is per thread, and the caller's own CUDA work on that
// thread must not land on another GPU because dlasync ran there; restoring
// with cudaSetDevice instead would open a context on the device the
// thread merely defaulted to (device 0), which a process serving another
// GPU never uses. Where the driver offers no context calls, the previous
// device is restored with cudaSetDevice.
//
// A guard exists only once its device is current: `enter` returns the
// failure of cudaSetDevice instead of a guard, so no caller can go on to
// run work on the wrong device.
//
// Example:
//
//   DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api, 1));
//   DLASYNC_CUDA_RETURN_IF_ERROR("cudaMallocAsync", 1, api.malloc_async(&p, n, s));
//   // cuda:1 stays current until `on` goes out of scope.
#pragma once

#include "absl/status/statusor.h"
#include "runtime/src/cuda/cuda_api.hpp"

namespace dlasync::detail {

class device_guard {
 public:
  // Makes `device` current; the error of cudaSetDevice when that fails.
  [[nodiscard]] static absl::StatusOr<device_guard> enter(cuda::api& api, int device);

  device_guard(device_guard&& other) noexcept;
  device_guard& operator=(device_guard&&) = delete;
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  // Makes the previous device current again, when it was known.
  ~device_guard();

 private:
  device_guard(cuda::api& api, bool context_saved, cuda::context_t context, int previous) noexcept
      : api_(&api), context_saved_(context_saved), context_(context), previous_(previous) {}

  cuda::api* api_;
  bool context_saved_;       // restore context_ (false: moved from, or no driver calls)
  cuda::context_t context_;  // the thread's context before, or null
  int previous_;             // without driver calls: the device to restore, -1 for none
};

}  // namespace dlasync::detail
