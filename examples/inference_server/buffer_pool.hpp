// Request buffers that are used again: a large body or a tensor read from
// shared memory lands in memory that is already mapped, instead of fresh
// pages that fault on first touch (a 16 MiB buffer is 4096 faults, which cost
// about as much as receiving its bytes).
//
//   buffer_pool pool(64 << 20);                      // keeps at most 64 MiB
//   std::shared_ptr<std::byte[]> b = pool.take(n, [&] { budget.release(n); });
//
// A buffer of 64 KiB or more comes from a size class (a power of two); a
// smaller one is allocated as it is. Dropping the last reference runs
// `on_release`, then keeps the block for the next take of its class while
// the pool holds less than its bound, or frees it.
//
// Thread safety: all members are safe from any thread; buffers may outlive
// the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "dlasync/dlasync.hpp"

namespace dlasync::examples {

class buffer_pool {
 public:
  static constexpr std::uint64_t min_pooled = std::uint64_t{64} << 10;

  explicit buffer_pool(std::uint64_t max_cached) : state_(std::make_shared<state>(max_cached)) {}

  // `bytes` bytes (at least 1), aligned for any scalar; `on_release` runs
  // when the last reference goes.
  std::shared_ptr<std::byte[]> take(std::uint64_t bytes, std::function<void()> on_release);

  // `bytes` bytes taken from `budget` now, given back when the buffer's last
  // user lets go; null when the budget has no room now. From `pool` when
  // given, else a fresh allocation.
  static std::shared_ptr<std::byte[]> take_budgeted(memory_budget& budget, std::uint64_t bytes,
                                                    buffer_pool* pool = nullptr);

  // Bytes kept for reuse now.
  std::uint64_t cached() const;

 private:
  // A fresh, unpooled buffer.
  static std::shared_ptr<std::byte[]> fresh(std::uint64_t bytes, std::function<void()> on_release);

  struct state {
    explicit state(std::uint64_t max) : max_cached(max) {}
    const std::uint64_t max_cached;
    mutable std::mutex mutex;
    std::uint64_t cached = 0;
    std::map<std::uint64_t, std::vector<std::unique_ptr<std::byte[]>>> free_blocks;
  };
  std::shared_ptr<state> state_;
};

}  // namespace dlasync::examples
