#include "runtime/src/host/host_block_cache.hpp"

#include <bit>
#include <cstdlib>
#include <iterator>

namespace dlasync::detail {

host_block_cache::~host_block_cache() {
  for (const entry& e : order_) std::free(e.block);
}

std::uint64_t host_block_cache::size_class(std::uint64_t bytes) {
  if (bytes <= 4096) return 4096;
  // Four steps per power of two: 1, 1.25, 1.5, 1.75 times it.
  const int top = static_cast<int>(std::bit_width(bytes - 1)) - 1;
  const std::uint64_t step = std::uint64_t{1} << (top - 2);
  return (bytes + step - 1) / step * step;
}

void* host_block_cache::acquire(std::uint64_t bytes, std::size_t alignment,
                                std::uint64_t& capacity) {
  if (bytes >= min_bytes_) {
    // A whole number of alignments, as aligned_alloc requires: classes of
    // 4 to 16 KiB step by 1 or 2 KiB, which a 4 KiB alignment does not divide.
    capacity = (size_class(bytes) + alignment - 1) / alignment * alignment;
    std::lock_guard lock(mutex_);
    auto it = free_.find(key{capacity, alignment});
    if (it != free_.end() && !it->second.empty()) {
      // The most recently released: its pages are the likeliest in cache.
      const lru::iterator e = it->second.back();
      it->second.pop_back();
      void* block = e->block;
      order_.erase(e);
      cached_ -= capacity;
      return block;
    }
  } else {
    capacity = (bytes + alignment - 1) / alignment * alignment;
  }
  if (capacity < bytes) return nullptr;  // rounding overflowed
  return std::aligned_alloc(alignment, capacity);
}

void host_block_cache::release(void* block, std::uint64_t capacity, std::size_t alignment) {
  if (capacity < min_bytes_ || capacity > cap_bytes_) return std::free(block);
  std::vector<void*> evicted;
  {
    std::lock_guard lock(mutex_);
    while (cached_ + capacity > cap_bytes_) {
      const entry oldest = order_.front();
      std::deque<lru::iterator>& same = free_[oldest.k];
      same.pop_front();  // the oldest of its key is the first
      order_.pop_front();
      cached_ -= oldest.k.capacity;
      evicted.push_back(oldest.block);
    }
    const key k{capacity, alignment};
    order_.push_back({k, block});
    free_[k].push_back(std::prev(order_.end()));
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
