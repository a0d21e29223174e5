#include "pinned_pool.hpp"

namespace dlasync::examples {

absl::StatusOr<std::shared_ptr<void>> pinned_pool::take(std::size_t bytes) {
  device_buffer block;
  {
    std::lock_guard lock(state_->mutex);
    auto it = state_->free_blocks.find(bytes);
    if (it != state_->free_blocks.end()) {
      block = std::move(it->second);
      state_->free_blocks.erase(it);
    }
  }
  if (block.data() == nullptr) {
    absl::StatusOr<device_buffer> fresh = state_->rt.allocate({device_kind::cuda_host, 0}, bytes);
    if (!fresh.ok()) return fresh.status();
    block = *std::move(fresh);
  }
  void* data = block.data();
  auto holder = std::make_shared<device_buffer>(std::move(block));
  return std::shared_ptr<void>(data, [s = state_, bytes, holder](void*) {
    std::lock_guard lock(s->mutex);
    s->free_blocks.emplace(bytes, std::move(*holder));
  });
}

}  // namespace dlasync::examples
