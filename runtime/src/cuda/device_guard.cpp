#include "runtime/src/cuda/device_guard.hpp"

#include <utility>

namespace dlasync::detail {

absl::StatusOr<device_guard> device_guard::enter(cuda::api& api, int device) {
  int previous = -1;
  if (api.get_device(&previous) != cuda::error::success) previous = -1;
  if (const cuda::error e = api.set_device(device); e != cuda::error::success) {
    return cuda::to_status(e, "cudaSetDevice", device);
  }
  return device_guard(api, previous);
}

device_guard::device_guard(device_guard&& other) noexcept
    : api_(other.api_), previous_(std::exchange(other.previous_, -1)) {}

device_guard::~device_guard() {
  // A failure here leaves the thread on the guard's device; nothing better
  // can be done in a destructor, and the next guard sets its own device.
  if (previous_ >= 0) (void)api_->set_device(previous_);
}

}  // namespace dlasync::detail
