#include "transfer/src/kernels/strided_copy.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "catch2/catch.hpp"
#include "transfer/src/kernels/copy_kernels.hpp"

namespace dlasync {
namespace {

// The obvious element-by-element gather, as the reference.
std::vector<std::uint8_t> reference(const std::uint8_t* first, const strided_layout& l) {
  std::int64_t count = 1;
  for (std::int64_t e : l.shape) count *= e;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(count) * l.element_size);
  std::vector<std::int64_t> index(l.shape.size(), 0);
  for (std::int64_t k = 0; k < count; ++k) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < index.size(); ++d) off += index[d] * l.strides[d];
    std::memcpy(out.data() + k * static_cast<std::int64_t>(l.element_size),
                first + off * static_cast<std::int64_t>(l.element_size), l.element_size);
    for (std::size_t d = index.size(); d-- > 0;) {
      if (++index[d] < l.shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

struct source_buffer {
  std::vector<std::uint8_t> bytes;
  const std::uint8_t* first = nullptr;
};

// A buffer large enough for the layout, and where its first element sits.
source_buffer make_source(const strided_layout& l) {
  std::int64_t low = 0;
  std::int64_t high = 0;
  for (std::size_t d = 0; d < l.shape.size(); ++d) {
    if (l.shape[d] == 0) return {};
    const std::int64_t reach = (l.shape[d] - 1) * l.strides[d];
    (reach < 0 ? low : high) += reach;
  }
  source_buffer s;
  s.bytes.resize(static_cast<std::size_t>(high - low + 1) * l.element_size);
  for (std::size_t i = 0; i < s.bytes.size(); ++i)
    s.bytes[i] = static_cast<std::uint8_t>(i * 37 + 11);
  s.first = s.bytes.data() - low * static_cast<std::int64_t>(l.element_size);
  return s;
}

void check_layout(const strided_layout& l) {
  const source_buffer src = make_source(l);
  const std::vector<std::uint8_t> want = reference(src.first, l);
  strided_copy copy(l);
  REQUIRE(copy.bytes() == want.size());
  std::vector<std::uint8_t> got(want.size() + 1, 0xEE);
  copy.run(src.first, got.data(), 0, copy.units());
  CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
  CHECK(got.back() == 0xEE);  // nothing written past the end

  // Each unit range lands in its own chunk at dst_offset: a staging copy.
  const std::int64_t n = copy.units();
  REQUIRE(copy.dst_offset(0) == 0);
  REQUIRE(copy.dst_offset(n) == copy.bytes());
  std::vector<std::uint8_t> chunked(want.size());
  for (std::int64_t begin = 0; begin < n; begin += 2) {
    const std::int64_t end = std::min(n, begin + 2);
    const std::uint64_t from = copy.dst_offset(begin);
    const std::uint64_t to = copy.dst_offset(end);
    REQUIRE(from <= to);
    std::vector<std::uint8_t> chunk(to - from + 1, 0xEE);
    copy.run(src.first, chunk.data(), begin, end, from);
    CHECK(chunk.back() == 0xEE);  // the units stay inside their range
    std::memcpy(chunked.data() + from, chunk.data(), to - from);
  }
  CHECK(std::memcmp(chunked.data(), want.data(), want.size()) == 0);

  // Split into uneven ranges, run backwards: the same bytes.
  std::vector<std::uint8_t> split(want.size() + 1, 0xEE);
  const std::int64_t units = copy.units();
  for (std::int64_t end = units; end > 0;) {
    const std::int64_t begin = std::max<std::int64_t>(0, end - 3);
    copy.run(src.first, split.data(), begin, end);
    end = begin;
  }
  CHECK(std::memcmp(split.data(), want.data(), want.size()) == 0);
}

}  // namespace

TEST_CASE("contiguous sources are copied with memcpy runs", "[runtime][copy]") {
  strided_layout l{4, {3, 1000}, {1000, 1}};
  strided_copy copy(l);
  CHECK(copy.which() == strided_copy::kernel::runs);
  check_layout(l);
  check_layout({4, {70000}, {1}});  // split into several units
  CHECK(strided_copy({4, {70000}, {1}}).units() > 1);
}

TEST_CASE("transposes are copied in cache tiles", "[runtime][copy]") {
  strided_layout l{4, {100, 70}, {1, 100}};
  CHECK(strided_copy(l).which() == strided_copy::kernel::tile);
  check_layout(l);
  check_layout({8, {3, 50, 40}, {2000, 1, 50}});
  check_layout({2, {40, 3, 50}, {1, 2000, 40}});
  // Every element size with a register kernel, with ragged edges.
  check_layout({1, {33, 47}, {1, 33}});
  check_layout({2, {35, 29}, {1, 35}});
  check_layout({4, {37, 26}, {1, 37}});
  check_layout({8, {19, 23}, {1, 19}});
  check_layout({16, {9, 17}, {1, 9}});
  // Dimensions between the tile dimension and the last are inside each unit.
  strided_layout middle{4, {40, 3, 5, 24}, {1, 40 * 24 * 5, 40 * 24, 40}};
  CHECK(strided_copy(middle).which() == strided_copy::kernel::tile);
  check_layout(middle);
}

TEST_CASE("large ragged copies match the reference", "[runtime][copy]") {
  // Ragged transposes: whole-line tiles, then the edges.
  check_layout({4, {1500, 1500}, {1, 1500}});
  check_layout({2, {2050, 2100}, {1, 2050}});
  check_layout({8, {1030, 1030}, {1, 1030}});
  // Runs of 4 KiB at an odd offset, and runs of 4 KiB + 12 bytes.
  check_layout({4, {2100, 1024}, {2051, 1}});
  check_layout({1, {2100, 4108}, {5000, 1}});
}

namespace {

// Lets large copies write with streaming stores on every CPU for a scope
// (by default AMD's get none; copy_kernels.hpp says why).
struct streaming_everywhere {
  streaming_everywhere() { strided_copy::allow_streaming(true); }
  ~streaming_everywhere() { strided_copy::allow_streaming(false); }
  streaming_everywhere(const streaming_everywhere&) = delete;
  streaming_everywhere& operator=(const streaming_everywhere&) = delete;
};

// 4 MiB of float32 transposed: past the size where tiles write with
// streaming stores. A destination aligned to a line, to 16 bytes only, and
// to 4 bytes (which streams nothing) get the same bytes. Then a 4 MiB
// broadcast, whose runs stream too.
void check_streaming_tiles() {
  const streaming_everywhere streaming;
  const strided_layout l{4, {1024, 1024}, {1, 1024}};
  const source_buffer src = make_source(l);
  const std::vector<std::uint8_t> want = reference(src.first, l);
  const strided_copy copy(l);
  REQUIRE(copy.which() == strided_copy::kernel::tile);
  std::vector<std::uint8_t> space(want.size() + 256, 0xEE);
  const auto base = reinterpret_cast<std::uintptr_t>(space.data());
  const std::size_t aligned = (64 - base % 64) % 64;
  for (const std::size_t offset : {aligned, aligned + 16, aligned + 4}) {
    std::fill(space.begin(), space.end(), 0xEE);
    std::uint8_t* dst = space.data() + offset;
    copy.run(src.first, dst, 0, copy.units());
    CHECK(std::memcmp(dst, want.data(), want.size()) == 0);
    CHECK(dst[want.size()] == 0xEE);
    CHECK((offset == 0 || dst[-1] == 0xEE));
  }
  check_layout({4, {4096, 256}, {0, 1}});
  check_layout({4, {4100, 259}, {0, 1}});
}

// Turns the AVX-512 tiles off for a scope: 4-byte tiles take the AVX2
// kernel where the CPU has it.
struct no_avx512_tiles {
  no_avx512_tiles() { strided_copy::allow_avx512(false); }
  ~no_avx512_tiles() { strided_copy::allow_avx512(true); }
  no_avx512_tiles(const no_avx512_tiles&) = delete;
  no_avx512_tiles& operator=(const no_avx512_tiles&) = delete;
};

// Turns the AVX2 and AVX-512 kernels off for a scope.
struct portable_kernels {
  portable_kernels() { strided_copy::allow_avx2(false); }
  ~portable_kernels() { strided_copy::allow_avx2(true); }
  portable_kernels(const portable_kernels&) = delete;
  portable_kernels& operator=(const portable_kernels&) = delete;
  no_avx512_tiles tiles;
};

// Tile layouts of 4-byte elements with ragged edges, short and long rows,
// in and past the caches, and a 3-D plane batch.
void check_float_tiles() {
  check_layout({4, {100, 70}, {1, 100}});                            // 400-byte rows
  check_layout({4, {37, 26}, {1, 37}});                              // edges only
  check_layout({4, {128, 128}, {1, 128}});                           // 512-byte rows
  check_layout({4, {129, 200}, {1, 129}});                           // just past 512
  check_layout({4, {1500, 1500}, {1, 1500}});                        // 9 MB
  check_layout({4, {40, 3, 5, 24}, {1, 40 * 24 * 5, 40 * 24, 40}});  // middle dimensions
  check_layout({4, {3, 1000, 1003}, {1000 * 1003, 1, 1000}});        // 12 MB of planes
}

}  // namespace

TEST_CASE("large tiles stream whole lines, at any destination alignment", "[runtime][copy]") {
  check_streaming_tiles();
}

TEST_CASE("the portable kernels, without AVX2, match the reference too", "[runtime][copy]") {
  // Where the CPU has AVX2, runs of 32 bytes and more and tiles of 4-byte
  // elements use it; the same layouts through the SSE2 and memcpy kernels.
  const portable_kernels portable;
  check_float_tiles();
  for (const std::int64_t n : {31, 32, 33, 100, 1024}) {
    check_layout({1, {13, n}, {n + 5, 1}});
    check_layout({1, {6, n}, {0, 1}});
  }
  check_streaming_tiles();
}

TEST_CASE("the AVX2 tiles, with AVX-512 off, match the reference too", "[runtime][copy]") {
  const no_avx512_tiles avx2;
  check_float_tiles();
  check_streaming_tiles();
}

TEST_CASE("AVX-512 tiles: registers for short rows, loops for long ones, prefetches past 4 MiB",
          "[runtime][copy]") {
  if (!copy_kernels::avx512_tiles()) {
    WARN("this CPU gets no AVX-512 tiles (none, or Intel's); the other kernels ran instead");
  }
  check_float_tiles();
  check_streaming_tiles();
  // Visits of 2 KiB up to 32 MiB and 1 KiB past it, not whole pages (the
  // AVX2 tiles'): 2048 rows of 8 KiB (16 MiB) are cut into 4 units of 512
  // rows; 2900 rows of 11,600 bytes (34 MB) into 12 of 256, not 3 of 1024.
  CHECK(strided_copy({4, {2048, 2048}, {1, 2048}}).units() == 4);
  const std::int64_t units = strided_copy({4, {2900, 2900}, {1, 2900}}).units();
  CHECK(units == (copy_kernels::avx512_tiles() ? 12 : 3));
  check_layout({4, {2900, 2903}, {1, 2900}});
}

TEST_CASE("tiles past 32 MiB visit a page of each source row", "[runtime][copy]") {
  // 2 KiB of each source row per unit below 32 MiB, 4 KiB from there on:
  // twice the rows per unit, for every element size, with ragged edges
  // (neither side a multiple of a unit or a line) and a 3-D plane batch.
  // (The AVX-512 tiles of 4-byte elements keep 2 KiB; see above.)
  const no_avx512_tiles avx2;
  CHECK(strided_copy({4, {2048, 2048}, {1, 2048}}).units() == 4);   // 16 MiB: 512 rows
  CHECK(strided_copy({4, {2900, 2900}, {1, 2900}}).units() == 3);   // 1024 rows
  CHECK(strided_copy({16, {1450, 1450}, {1, 1450}}).units() == 6);  // 256 rows
  check_layout({1, {5800, 5801}, {1, 5800}});
  check_layout({2, {4100, 4103}, {1, 4100}});
  check_layout({4, {2900, 2903}, {1, 2900}});
  check_layout({8, {2050, 2053}, {1, 2050}});
  check_layout({16, {1450, 1453}, {1, 1450}});
  check_layout({4, {3, 1500, 2003}, {1500 * 2003, 1, 1500}});
}

TEST_CASE("tiles walk several units in pieces that start at source pages", "[runtime][copy]") {
  // Ranges of several units of a page each are walked in pieces aligned to
  // the source's pages where its rows start on a line: at a page start, a
  // line and half a page past one, and 4 bytes past a line (not aligned).
  const no_avx512_tiles avx2;
  for (const strided_layout& l : {strided_layout{4, {2900, 2903}, {1, 2900}},
                                  strided_layout{4, {3, 1536, 2048}, {1536 * 2048, 1, 1536}},
                                  strided_layout{8, {2050, 2053}, {1, 2050}}}) {
    const source_buffer reach = make_source(l);
    const std::vector<std::uint8_t> want = reference(reach.first, l);
    const strided_copy copy(l);
    REQUIRE(copy.units() > 2);
    std::vector<std::uint8_t> space(reach.bytes.size() + 3 * 4096);
    const auto base = reinterpret_cast<std::uintptr_t>(space.data());
    const std::size_t page = (4096 - base % 4096) % 4096;
    for (const std::size_t phase :
         {std::size_t{0}, std::size_t{64}, std::size_t{2048}, std::size_t{68}}) {
      std::uint8_t* src = space.data() + page + phase;
      std::memcpy(src, reach.bytes.data(), reach.bytes.size());
      std::vector<std::uint8_t> got(want.size() + 1, 0xEE);
      copy.run(src, got.data(), 0, copy.units());
      CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
      CHECK(got.back() == 0xEE);
      // Ranges of two units, each into its own chunk.
      for (std::int64_t begin = 0; begin < copy.units(); begin += 2) {
        const std::int64_t end = std::min(copy.units(), begin + 2);
        const std::uint64_t from = copy.dst_offset(begin);
        const std::uint64_t to = copy.dst_offset(end);
        std::vector<std::uint8_t> chunk(to - from + 1, 0xEE);
        copy.run(src, chunk.data(), begin, end, from);
        CHECK(std::memcmp(chunk.data(), want.data() + from, to - from) == 0);
        CHECK(chunk.back() == 0xEE);
      }
    }
  }
}

TEST_CASE("broadcast, reversed and sparse strides are gathered", "[runtime][copy]") {
  CHECK(strided_copy({4, {5, 6}, {1, 0}}).which() == strided_copy::kernel::gather);
  check_layout({4, {5, 6}, {1, 0}});
  check_layout({4, {5, 6}, {0, 1}});
  check_layout({1, {300}, {-1}});
  check_layout({16, {7, 9}, {-9, -1}});
  check_layout({8, {6, 7}, {14, 2}});
}

TEST_CASE("contiguous dimensions are merged and extents of 1 dropped", "[runtime][copy]") {
  strided_layout l{2, {2, 1, 3, 4}, {12, 99, 4, 1}};
  strided_copy copy(l);
  CHECK(copy.which() == strided_copy::kernel::runs);
  CHECK(copy.units() == 1);
  check_layout(l);
}

TEST_CASE("empty and single-element layouts", "[runtime][copy]") {
  strided_copy empty({4, {3, 0, 2}, {0, 1, 1}});
  CHECK(empty.units() == 0);
  CHECK(empty.bytes() == 0);
  empty.run(nullptr, nullptr, 0, 0);
  check_layout({8, {}, {}});
  check_layout({8, {1, 1}, {5, 7}});
}

TEST_CASE("runs of every length, in 2 to 4 dimensions, match the reference", "[runtime][copy]") {
  // Runs of 32 bytes and more move in registers, the last 32 bytes of a run
  // overlapping the piece before; shorter ones by memcpy. The unit ranges
  // check_layout runs stop and start inside a dimension and across its end.
  for (const std::int64_t n :
       {1, 7, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 160, 255, 256, 257, 1000, 1024}) {
    INFO("run of " << n << " bytes");
    check_layout({1, {13, n}, {n + 5, 1}});                     // rows
    check_layout({1, {3, 5, n}, {5 * (n + 9) + 3, n + 9, 1}});  // two outer dimensions
    check_layout({1, {2, 3, 2, n}, {7 * n, 2 * n, n + 1, 1}});  // three
    check_layout({1, {6, n}, {0, 1}});                          // broadcast
    check_layout({1, {6, n}, {-(n + 2), 1}});                   // reversed
    check_layout({4, {7, n}, {2 * n, 1}});                      // float rows
  }
}

TEST_CASE("broadcasts past 4 MiB match the reference, inline and by memcpy per run",
          "[runtime][copy]") {
  // A small source read again and again is copied inline at any size; a
  // source past a core's cache, or runs under 32 bytes, by memcpy per run.
  check_layout({4, {5000, 259}, {0, 1}});           // 1036-byte runs, 5 MB
  check_layout({4, {40, 200, 160}, {0, 160, 1}});   // a 128 KB plane, 40 times
  check_layout({1, {200000, 31}, {0, 1}});          // 31-byte runs
  check_layout({4, {16, 300, 300}, {0, 300, 1}});   // a 360 KB plane, 16 times
  check_layout({4, {6000, 2, 250}, {0, -250, 1}});  // reversed inside, broadcast outside
}

TEST_CASE("random layouts match the reference for every element size", "[runtime][copy]") {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t sizes[] = {1, 2, 4, 8, 16, 3};
    strided_layout l;
    l.element_size = sizes[trial % 6];
    const int ndim = 1 + static_cast<int>(rng() % 4);
    for (int d = 0; d < ndim; ++d) {
      l.shape.push_back(1 + static_cast<std::int64_t>(rng() % 9));
      l.strides.push_back(static_cast<std::int64_t>(rng() % 41) - 12);
    }
    INFO("trial " << trial);
    check_layout(l);
  }
}

}  // namespace dlasync
