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

}  // namespace dlasync::detail
