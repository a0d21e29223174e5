#include "runtime/src/host/host_block_cache.hpp"

#include <bit>
#include <cstdlib>
#include <new>
#include <vector>

namespace dlasync::detail {

host_block_cache::~host_block_cache() {
  for (free_block* b = oldest_; b != nullptr;) {
    free_block* next = b->newer;
    std::free(b);
    b = next;
  }
}

std::uint64_t host_block_cache::size_class(std::uint64_t bytes) {
  if (bytes <= 4096) return 4096;
  // Four steps per power of two: 1, 1.25, 1.5, 1.75 times it.
  const int top = static_cast<int>(std::bit_width(bytes - 1)) - 1;
  const std::uint64_t step = std::uint64_t{1} << (top - 2);
  return (bytes + step - 1) / step * step;
}

std::uint64_t host_block_cache::capacity_for(std::uint64_t bytes,
                                             std::size_t alignment) const noexcept {
  // A whole number of alignments, as aligned_alloc requires: classes of 4 to
  // 16 KiB step by 1 or 2 KiB, which a 4 KiB alignment does not divide.
  const std::uint64_t rounded = bytes >= min_bytes_ ? size_class(bytes) : bytes;
  const std::uint64_t capacity = (rounded + alignment - 1) / alignment * alignment;
  return capacity < bytes ? 0 : capacity;
}

void host_block_cache::unlink(free_block* b, same_key& same) noexcept {
  (b->older != nullptr ? b->older->newer : oldest_) = b->newer;
  (b->newer != nullptr ? b->newer->older : newest_) = b->older;
  (b->older_same != nullptr ? b->older_same->newer_same : same.oldest) = b->newer_same;
  (b->newer_same != nullptr ? b->newer_same->older_same : same.newest) = b->older_same;
  cached_ -= b->k.capacity;
}

void* host_block_cache::acquire(std::uint64_t bytes, std::size_t alignment,
                                std::uint64_t& capacity) {
  capacity = capacity_for(bytes, alignment);
  if (capacity == 0 && bytes != 0) return nullptr;  // rounding overflowed
  if (bytes >= min_bytes_ && capacity <= cap_bytes_) {
    std::lock_guard lock(mutex_);
    auto it = free_.find(key{capacity, alignment});
    if (it != free_.end() && it->second.newest != nullptr) {
      // The most recently released: its pages are the likeliest in cache.
      free_block* b = it->second.newest;
      unlink(b, it->second);
      return b;
    }
  }
  return std::aligned_alloc(alignment, capacity);
}

void host_block_cache::release(void* block, std::uint64_t capacity, std::size_t alignment) {
  if (capacity < min_bytes_ || capacity > cap_bytes_ || capacity < sizeof(free_block)) {
    return std::free(block);
  }
  std::vector<void*> evicted;
  {
    std::lock_guard lock(mutex_);
    while (cached_ + capacity > cap_bytes_) {
      // The oldest block is the oldest of its key too.
      free_block* oldest = oldest_;
      unlink(oldest, free_[oldest->k]);
      evicted.push_back(oldest);
    }
    const key k{capacity, alignment};
    same_key& same = free_[k];
    auto* b = new (block) free_block{newest_, nullptr, same.newest, nullptr, k};
    (newest_ != nullptr ? newest_->newer : oldest_) = b;
    newest_ = b;
    (same.newest != nullptr ? same.newest->newer_same : same.oldest) = b;
    same.newest = b;
    cached_ += capacity;
  }
  // Outside the lock: giving large blocks back unmaps them.
  for (void* b : evicted) std::free(b);
}

std::uint64_t host_block_cache::cached_bytes() const {
  std::lock_guard lock(mutex_);
  return cached_;
}

}  // namespace dlasync::detail
