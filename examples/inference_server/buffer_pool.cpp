#include "buffer_pool.hpp"

#include <bit>
#include <utility>

namespace dlasync::examples {

std::shared_ptr<std::byte[]> buffer_pool::fresh(std::uint64_t bytes,
                                                std::function<void()> on_release) {
  return {new std::byte[bytes > 0 ? bytes : 1], [release = std::move(on_release)](std::byte* p) {
            delete[] p;
            if (release) release();
          }};
}

std::shared_ptr<std::byte[]> buffer_pool::take_budgeted(memory_budget& budget, std::uint64_t bytes,
                                                        buffer_pool* pool) {
  if (bytes > 0 && !budget.try_acquire(bytes)) return nullptr;
  std::function<void()> release = [&budget, bytes] {
    if (bytes > 0) budget.release(bytes);
  };
  return pool != nullptr ? pool->take(bytes, std::move(release)) : fresh(bytes, std::move(release));
}

std::shared_ptr<std::byte[]> buffer_pool::take(std::uint64_t bytes,
                                               std::function<void()> on_release) {
  if (bytes < min_pooled) return fresh(bytes, std::move(on_release));
  const std::uint64_t size_class = std::bit_ceil(bytes);
  std::unique_ptr<std::byte[]> block;
  {
    std::lock_guard lock(state_->mutex);
    auto it = state_->free_blocks.find(size_class);
    if (it != state_->free_blocks.end() && !it->second.empty()) {
      block = std::move(it->second.back());
      it->second.pop_back();
      state_->cached -= size_class;
    }
  }
  if (!block) block = std::make_unique_for_overwrite<std::byte[]>(size_class);
  std::byte* data = block.get();
  auto holder = std::make_shared<std::unique_ptr<std::byte[]>>(std::move(block));
  return {data, [s = state_, size_class, holder, release = std::move(on_release)](std::byte*) {
            if (release) release();
            std::lock_guard lock(s->mutex);
            if (s->cached + size_class > s->max_cached) return;  // freed with the holder
            s->cached += size_class;
            s->free_blocks[size_class].push_back(std::move(*holder));
          }};
}

std::uint64_t buffer_pool::cached() const {
  std::lock_guard lock(state_->mutex);
  return state_->cached;
}

}  // namespace dlasync::examples
