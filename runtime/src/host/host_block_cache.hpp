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

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>

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

  // A block of at least `bytes`, aligned to `alignment` (a power of two of
  // at least 64); nullptr when the system has no memory. `capacity`
  // receives the block's real size, to be given back to `release`: always
  // capacity_for(bytes, alignment).
  void* acquire(std::uint64_t bytes, std::size_t alignment, std::uint64_t& capacity);
  void release(void* block, std::uint64_t capacity, std::size_t alignment);

  // The capacity of a block acquired for `bytes` at `alignment`; 0 where
  // rounding overflows.
  std::uint64_t capacity_for(std::uint64_t bytes, std::size_t alignment) const noexcept;

  std::uint64_t cached_bytes() const;

 private:
  friend class host_block_cache_ref;

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

  // A free block's own first bytes (a block is at least a page): its place
  // in the order of release, among all blocks and among those of its key.
  // Kept in the blocks, so that caching one allocates nothing.
  struct free_block {
    free_block* older;
    free_block* newer;
    free_block* older_same;
    free_block* newer_same;
    key k;
  };
  struct same_key {
    free_block* oldest = nullptr;
    free_block* newest = nullptr;
  };

  // Takes `b` out of both orders.
  void unlink(free_block* b, same_key& same) noexcept;

  const std::uint64_t min_bytes_;
  const std::uint64_t cap_bytes_;
  // The backend's reference and each handed-out block's (host_block_cache_ref).
  std::atomic<std::int64_t> refs_{1};
  mutable std::mutex mutex_;
  std::uint64_t cached_ = 0;
  // Free blocks, least recently released first; and by key.
  free_block* oldest_ = nullptr;
  free_block* newest_ = nullptr;
  absl::flat_hash_map<key, same_key> free_;
};

// A counted reference to a cache, which the last one deletes: the backend
// holds one, and so does each block it handed out, which may outlive the
// backend. Eight bytes where a shared_ptr takes sixteen, so that a block's
// release function fits in an AnyInvocable's own storage and costs no
// allocation.
class host_block_cache_ref {
 public:
  host_block_cache_ref() noexcept = default;
  // Adopts a new cache's first reference.
  explicit host_block_cache_ref(host_block_cache* adopted) noexcept : cache_(adopted) {}
  host_block_cache_ref(const host_block_cache_ref& other) noexcept : cache_(other.cache_) {
    if (cache_ != nullptr) cache_->refs_.fetch_add(1, std::memory_order_relaxed);
  }
  host_block_cache_ref(host_block_cache_ref&& other) noexcept
      : cache_(std::exchange(other.cache_, nullptr)) {}
  host_block_cache_ref& operator=(host_block_cache_ref other) noexcept {
    std::swap(cache_, other.cache_);
    return *this;
  }
  ~host_block_cache_ref() {
    if (cache_ != nullptr && cache_->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      delete cache_;
    }
  }

  host_block_cache* operator->() const noexcept { return cache_; }
  host_block_cache& operator*() const noexcept { return *cache_; }

 private:
  host_block_cache* cache_ = nullptr;
};

}  // namespace dlasync::detail
