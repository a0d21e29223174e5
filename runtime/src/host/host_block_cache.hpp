// A cache of freed host blocks, so that large copies reuse memory whose
// pages are already mapped instead of page-faulting through fresh memory on
// every import. Blocks are kept by size class (four classes per power of
// two, so at most a quarter of a block is slack) up to a byte cap. A block
// released into a full cache makes room by giving the least recently
// released blocks back to the system, so the cache follows the sizes in use
// now; a block larger than the cap goes back at once. Shared by the host
// backend and by every buffer it handed out, so buffers may outlive the
// runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace dlasync::detail {

class host_block_cache {
 public:
  // Blocks below `min_bytes` come straight from aligned_alloc and go back
  // to free; at most `cap_bytes` of free blocks are kept.
  host_block_cache(std::uint64_t min_bytes, std::uint64_t cap_bytes)
      : min_bytes_(min_bytes), cap_bytes_(cap_bytes) {}
  ~host_block_cache();

  host_block_cache(const host_block_cache&) = delete;
  host_block_cache& operator=(const host_block_cache&) = delete;

  // A block of at least `bytes`, aligned to `alignment`; nullptr when the
  // system has no memory. `capacity` receives the block's real size, to be
  // given back to `release`.
  void* acquire(std::uint64_t bytes, std::size_t alignment, std::uint64_t& capacity);
  void release(void* block, std::uint64_t capacity, std::size_t alignment);

  std::uint64_t cached_bytes() const;

 private:
  static std::uint64_t size_class(std::uint64_t bytes);

  struct key {
    std::uint64_t capacity;
    std::size_t alignment;
    friend bool operator==(const key&, const key&) = default;
    template <typename H>
    friend H AbslHashValue(H h, const key& k) {
      return H::combine(std::move(h), k.capacity, k.alignment);
    }
  };

  struct entry {
    key k;
    void* block;
  };
  using lru = std::list<entry>;

  const std::uint64_t min_bytes_;
  const std::uint64_t cap_bytes_;
  mutable std::mutex mutex_;
  std::uint64_t cached_ = 0;
  // Free blocks, least recently released first; and by key, oldest first.
  lru order_;
  // A deque: eviction takes a key's oldest block from the front, and a key
  // may hold hundreds of thousands of 4 KiB blocks.
  absl::flat_hash_map<key, std::deque<lru::iterator>> free_;
};

}  // namespace dlasync::detail
