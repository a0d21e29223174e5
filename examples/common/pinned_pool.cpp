#include "pinned_pool.hpp"

namespace dlasync::examples {

pinned_pool::state::~state() {
  for (auto& [bytes, block] : free_blocks) (void)api.free_host(block);
}

absl::StatusOr<std::shared_ptr<void>> pinned_pool::take(std::size_t bytes) {
  void* block = nullptr;
  {
    std::lock_guard lock(state_->mutex);
    auto it = state_->free_blocks.find(bytes);
    if (it != state_->free_blocks.end()) {
      block = it->second;
      state_->free_blocks.erase(it);
    }
  }
  if (block == nullptr) {
    DLASYNC_CUDA_RETURN_IF_ERROR("cudaMallocHost", -1, state_->api.malloc_host(&block, bytes));
  }
  return std::shared_ptr<void>(block, [s = state_, bytes](void* p) {
    std::lock_guard lock(s->mutex);
    s->free_blocks.emplace(bytes, p);
  });
}

}  // namespace dlasync::examples
