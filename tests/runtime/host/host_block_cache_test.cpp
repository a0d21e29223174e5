// White-box tests of the host backend's cache of freed blocks.
#include "runtime/src/host/host_block_cache.hpp"

#include "catch2/catch.hpp"

namespace dlasync::detail {

TEST_CASE("freed blocks are reused by size, the most recently released first", "[runtime][cache]") {
  constexpr std::uint64_t mib = 1 << 20;
  host_block_cache cache(256 << 10, 3 * mib);
  std::uint64_t ca = 0;
  std::uint64_t cb = 0;
  void* a = cache.acquire(mib, 64, ca);
  void* b = cache.acquire(mib, 64, cb);
  REQUIRE(ca == mib);
  cache.release(a, ca, 64);
  cache.release(b, cb, 64);
  CHECK(cache.cached_bytes() == 2 * mib);
  std::uint64_t c = 0;
  CHECK(cache.acquire(mib, 64, c) == b);
  CHECK(cache.acquire(mib - 1000, 64, c) == a);  // same size class
  CHECK(cache.cached_bytes() == 0);
  void* other = cache.acquire(mib, 128, c);  // another alignment: a new block
  CHECK(other != a);
  CHECK(other != b);
  cache.release(a, mib, 64);
  cache.release(b, mib, 64);
  cache.release(other, mib, 128);
}

TEST_CASE("a full cache gives back its oldest blocks to keep the newest", "[runtime][cache]") {
  constexpr std::uint64_t mib = 1 << 20;
  host_block_cache cache(256 << 10, 3 * mib);
  std::uint64_t cap = 0;
  void* a = cache.acquire(mib, 64, cap);
  void* b = cache.acquire(mib, 64, cap);
  void* c = cache.acquire(mib, 64, cap);
  std::uint64_t big_cap = 0;
  void* big = cache.acquire(2 * mib, 64, big_cap);
  cache.release(a, mib, 64);
  cache.release(b, mib, 64);
  cache.release(c, mib, 64);
  CHECK(cache.cached_bytes() == 3 * mib);
  // 2 MiB more: a and b (the oldest) go, c stays.
  cache.release(big, big_cap, 64);
  CHECK(cache.cached_bytes() == 3 * mib);
  std::uint64_t got = 0;
  CHECK(cache.acquire(2 * mib, 64, got) == big);
  CHECK(cache.acquire(mib, 64, got) == c);
  CHECK(cache.cached_bytes() == 0);
  cache.release(big, big_cap, 64);
  cache.release(c, mib, 64);

  // Larger than the whole cache, or below its minimum: never kept.
  void* huge = cache.acquire(4 * mib, 64, got);
  cache.release(huge, got, 64);
  void* small = cache.acquire(4096, 64, got);
  cache.release(small, got, 64);
  CHECK(cache.cached_bytes() == 3 * mib);
}

TEST_CASE("a cached block is a whole number of its alignment", "[runtime][cache]") {
  // aligned_alloc requires it; size classes of 4 to 16 KiB step by 1 or 2 KiB.
  host_block_cache cache(4096, 1 << 20);
  for (const std::size_t alignment : {64, 2048, 4096}) {
    std::uint64_t cap = 0;
    void* block = cache.acquire(5000, alignment, cap);
    REQUIRE(block != nullptr);
    CHECK(cap >= 5000);
    CHECK(cap % alignment == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(block) % alignment == 0);
    cache.release(block, cap, alignment);
    std::uint64_t again = 0;
    CHECK(cache.acquire(5000, alignment, again) == block);
    CHECK(again == cap);
    cache.release(block, again, alignment);
  }
}

TEST_CASE("taking a block from the middle of the order keeps both orders whole",
          "[runtime][cache]") {
  // Two keys released in turn: a1 b1 a2 b2, oldest first. Taking a2 (the
  // newest of its key) leaves a1 b1 b2; eviction then goes a1 first, and
  // each key still gives its newest first.
  constexpr std::uint64_t kib = 1 << 10;
  host_block_cache cache(4 * kib, 4096 * kib);
  std::uint64_t cap = 0;
  void* a1 = cache.acquire(1024 * kib, 64, cap);
  void* a2 = cache.acquire(1024 * kib, 64, cap);
  void* b1 = cache.acquire(512 * kib, 64, cap);
  void* b2 = cache.acquire(512 * kib, 64, cap);
  cache.release(a1, 1024 * kib, 64);
  cache.release(b1, 512 * kib, 64);
  cache.release(a2, 1024 * kib, 64);
  cache.release(b2, 512 * kib, 64);
  CHECK(cache.cached_bytes() == 3072 * kib);
  CHECK(cache.acquire(1024 * kib, 64, cap) == a2);
  std::uint64_t big_cap = 0;
  void* big = cache.acquire(2048 * kib, 64, big_cap);
  cache.release(big, big_cap, 64);  // 2 + 2 MiB: fits, nothing evicted
  CHECK(cache.cached_bytes() == 4096 * kib);
  cache.release(a2, 1024 * kib, 64);  // a1, the oldest, makes room
  CHECK(cache.cached_bytes() == 4096 * kib);
  CHECK(cache.acquire(512 * kib, 64, cap) == b2);
  CHECK(cache.acquire(512 * kib, 64, cap) == b1);
  CHECK(cache.acquire(1024 * kib, 64, cap) == a2);
  CHECK(cache.acquire(2048 * kib, 64, cap) == big);
  CHECK(cache.cached_bytes() == 0);
  // The key of a1 is empty now: a new block, not a stale one.
  void* fresh = cache.acquire(1024 * kib, 64, cap);
  CHECK(cache.cached_bytes() == 0);
  for (void* p : {b1, b2}) cache.release(p, 512 * kib, 64);
  for (void* p : {a2, fresh}) cache.release(p, 1024 * kib, 64);
  cache.release(big, big_cap, 64);
}

TEST_CASE("a block's capacity follows from its bytes and alignment", "[runtime][cache]") {
  host_block_cache cache(4096, 1 << 20);
  for (const std::uint64_t bytes : {1ull, 100ull, 4095ull, 4096ull, 5000ull, 70000ull}) {
    for (const std::size_t alignment : {64, 256, 4096}) {
      std::uint64_t cap = 0;
      void* block = cache.acquire(bytes, alignment, cap);
      REQUIRE(block != nullptr);
      CHECK(cap == cache.capacity_for(bytes, alignment));
      cache.release(block, cap, alignment);
    }
  }
  CHECK(cache.capacity_for(~std::uint64_t{0} - 10, 64) == 0);  // rounding overflows
  std::uint64_t cap = 1;
  CHECK(cache.acquire(~std::uint64_t{0} - 10, 64, cap) == nullptr);
}

TEST_CASE("a cache lives while a reference to it does", "[runtime][cache]") {
  host_block_cache_ref backend(new host_block_cache(4096, 1 << 20));
  host_block_cache_ref held = backend;  // a handed-out block's
  std::uint64_t cap = 0;
  void* block = held->acquire(8192, 64, cap);
  backend = host_block_cache_ref();  // the backend goes first
  held->release(block, cap, 64);     // still there (ASan would say otherwise)
  CHECK(held->cached_bytes() == cap);
  host_block_cache_ref moved = std::move(held);
  CHECK(moved->cached_bytes() == cap);
}

}  // namespace dlasync::detail
