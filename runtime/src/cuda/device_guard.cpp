#include "runtime/src/cuda/device_guard.hpp"

#include <utility>

namespace dlasync::detail {

absl::StatusOr<device_guard> device_guard::enter(cuda::api& api, int device) {
  cuda::context_t context = nullptr;
  const bool saved = api.get_current_context(&context) == cuda::error::success;
  int previous = -1;
  if (!saved && api.get_device(&previous) != cuda::error::success) previous = -1;
  if (const cuda::error e = api.set_device(device); e != cuda::error::success) {
    // cudaSetDevice may have changed the thread's context before failing.
    if (saved) (void)api.set_current_context(context);
    return cuda::to_status(e, "cudaSetDevice", device);
  }
  return device_guard(api, saved, context, previous);
}

device_guard::device_guard(device_guard&& other) noexcept
    : api_(other.api_),
      context_saved_(std::exchange(other.context_saved_, false)),
      context_(other.context_),
      previous_(std::exchange(other.previous_, -1)) {}

device_guard::~device_guard() {
  // A failure here leaves the thread on the guard's device; nothing better
  // can be done in a destructor, and the next guard sets its own device.
  if (context_saved_) {
    (void)api_->set_current_context(context_);
  } else if (previous_ >= 0) {
    (void)api_->set_device(previous_);
  }
}

}  // namespace dlasync::detail
