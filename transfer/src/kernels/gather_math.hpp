// The gather kernels' arithmetic (internal), one definition for the CUDA
// kernels (gather_kernel.cu, built by nvcc) and for the simulation and the
// tests (built by g++), so that CI runs the index math the GPU runs.
//
// The kernels move words: each element is `words_per_element` words of
// `word_bytes` bytes. The word size is the largest of 16, 8, 4, 2 and 1
// that divides the element size and both base addresses: strides count
// whole elements, so every load and store is then aligned to its size (a
// misaligned one is a sticky cudaErrorMisalignedAddress on a GPU).
//
// Two kernels share the parameters:
//
//   gather  destination word i comes from source byte offset
//           gather_source_offset(i); threads cover the words with a
//           grid-stride loop over gather_geometry's grid. Writes are
//           coalesced; reads are as coalesced as the source's last
//           dimension is (well for runs, broadcasts and small strides).
//   tiles   a transpose: the source is contiguous (stride 1) along a
//           dimension other than the destination's last one, so the plain
//           gather would read one element per 32-byte sector. A block of
//           32 x 8 threads moves a tile of 32 x 32 elements through shared
//           memory: it loads the tile with consecutive threads on
//           consecutive source elements (down the tile's rows), waits
//           (__syncthreads), then stores it with consecutive threads on
//           consecutive destination elements (along the tile's columns).
//           Both sides are coalesced. The shared tile has a pitch of 33
//           words, so that the column-wise reads of the second phase fall in
//           32 different banks (a pitch of 32 would put a warp's reads all
//           in one bank: a 32-way conflict); that holds for words of 4, 8
//           and 16 bytes alike. Other dimensions are batches, and tiles are
//           numbered batch-major and visited by a grid-stride loop over
//           blocks. Tiles need whole-element words (words_per_element 1).
//
// Divisions by extents use precomputed magic numbers (fast_divisor): a
// 64-bit division is a long instruction sequence on a GPU, a multiply-high
// and a shift are a few.
//
// Plain C++17, no standard headers beyond <cstdint>: nvcc compiles it too.
#pragma once

#include <cstdint>

#include "dlasync/limits.hpp"

#if defined(__CUDACC__)
#define DLASYNC_HOST_DEVICE __host__ __device__
#else
#define DLASYNC_HOST_DEVICE
#endif

namespace dlasync::copy_kernels {

// The high 64 bits of the 128-bit product a * b, from 32-bit halves: for
// hosts without a 128-bit integer (and tested against one).
DLASYNC_HOST_DEVICE inline std::uint64_t mul_high_portable(std::uint64_t a, std::uint64_t b) {
  const std::uint64_t a_lo = a & 0xffffffffu;
  const std::uint64_t a_hi = a >> 32;
  const std::uint64_t b_lo = b & 0xffffffffu;
  const std::uint64_t b_hi = b >> 32;
  const std::uint64_t lo_lo = a_lo * b_lo;
  const std::uint64_t hi_lo = a_hi * b_lo;
  const std::uint64_t lo_hi = a_lo * b_hi;
  const std::uint64_t middle = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + lo_hi;
  return a_hi * b_hi + (hi_lo >> 32) + (middle >> 32);
}

// The high 64 bits of the 128-bit product a * b.
DLASYNC_HOST_DEVICE inline std::uint64_t mul_high(std::uint64_t a, std::uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#elif defined(__SIZEOF_INT128__)
  __extension__ using u128 = unsigned __int128;
  return static_cast<std::uint64_t>((static_cast<u128>(a) * b) >> 64);
#else
  return mul_high_portable(a, b);
#endif
}

// Division by a divisor d in [1, 2^63) fixed in advance, exact for every
// numerator n < 2^63 (every index of a tensor): Granlund and Montgomery,
// "Division by invariant integers using multiplication" (1994), theorem
// 4.2 with N = 63 and l = ceil(log2 d): the multiplier
// m = floor(2^(63+l) / d) + 1 satisfies 2^(63+l) < m*d <= 2^(63+l) + 2^l,
// so n / d == (m * n) >> (63 + l), and m < 2^64 fits a word. The product
// is taken as mul_high(m, 2n) >> l, which needs no 65-bit intermediate
// (2n < 2^64) and no shift by 64 (l <= 63).
struct fast_divisor {
  std::uint64_t magic = 0x8000000000000001u;  // divides by 1
  std::uint32_t shift = 0;
  std::uint32_t pad = 0;
};

// The magic numbers for `d` < 2^63 (host side; 0 is taken as 1, for
// empty tensors, whose extents are never divided by).
inline fast_divisor make_fast_divisor(std::uint64_t d) {
  if (d <= 1) return {};
  std::uint32_t l = 0;
  while (l < 63 && (std::uint64_t{1} << l) < d) ++l;
  // floor(2^(63+l) / d) by long division, one bit at a time: the quotient
  // has at most 64 bits (d > 2^(l-1)), and the remainder stays below d.
  std::uint64_t quotient = 0;
  std::uint64_t remainder = 0;
  for (int bit = 63 + static_cast<int>(l); bit >= 0; --bit) {
    remainder = (remainder << 1) | (bit == 63 + static_cast<int>(l) ? 1u : 0u);
    quotient <<= 1;
    if (remainder >= d) {
      remainder -= d;
      quotient |= 1;
    }
  }
  return {quotient + 1, l, 0};
}

DLASYNC_HOST_DEVICE inline std::uint64_t fast_divide(std::uint64_t n, const fast_divisor& d) {
  return mul_high(d.magic, n << 1) >> d.shift;
}

// Passed by value to the kernels: the source layout, simplified (extents
// of 1 dropped, dimensions the source is contiguous across merged),
// strides in elements. About 2.7 KiB: kernel parameters are limited to
// 4 KiB on the GPUs of every CUDA 12 toolkit without opting in.
struct gather_params {
  std::int64_t count = 0;  // words to move: elements * words_per_element
  int ndim = 0;
  int word_bytes = 1;
  int words_per_element = 1;
  int tile_dim = -1;  // tiles: the dimension with source stride 1; -1: gather
  std::int64_t element_bytes = 1;
  fast_divisor per_element;  // divides by words_per_element
  std::int64_t shape[max_ndim] = {};
  std::int64_t strides[max_ndim] = {};
  fast_divisor divide_by[max_ndim] = {};  // divide_by[d] divides by shape[d]
  // Tiles only.
  std::int64_t dst_strides[max_ndim] = {};  // the compact destination's, in elements
  std::int64_t tiles = 0;                   // batches * tile_rows * tile_cols
  fast_divisor divide_by_tile_cols;         // ceil(shape[ndim - 1] / 32)
  fast_divisor divide_by_tile_rows;         // ceil(shape[tile_dim] / 32)
};
static_assert(sizeof(gather_params) + 2 * sizeof(void*) <= 4096,
              "the kernels' parameters must fit in 4 KiB");

// The largest word (16, 8, 4, 2 or 1 bytes) that divides `element_bytes`
// and both addresses.
DLASYNC_HOST_DEVICE inline int gather_word_bytes(std::uint64_t src, std::uint64_t dst,
                                                 std::int64_t element_bytes) {
  const auto all = src | dst | static_cast<std::uint64_t>(element_bytes);
  for (int word = 16; word > 1; word /= 2) {
    if (all % static_cast<std::uint64_t>(word) == 0) return word;
  }
  return 1;
}

// Byte offset from the source's first element of destination word `i` <
// count (row-major order over the shape); negative and zero strides
// included. The outermost index needs no division: i < count bounds it.
DLASYNC_HOST_DEVICE inline std::int64_t gather_source_offset(std::int64_t i,
                                                             const gather_params& p) {
  const auto n = static_cast<std::uint64_t>(i);
  std::uint64_t rest = n;
  std::int64_t word = 0;
  if (p.words_per_element != 1) {
    rest = fast_divide(n, p.per_element);
    word = static_cast<std::int64_t>(n - rest * static_cast<std::uint64_t>(p.words_per_element));
  }
  std::int64_t offset = 0;
  for (int d = p.ndim - 1; d > 0; --d) {
    const std::uint64_t next = fast_divide(rest, p.divide_by[d]);
    const auto index =
        static_cast<std::int64_t>(rest - next * static_cast<std::uint64_t>(p.shape[d]));
    offset += index * p.strides[d];
    rest = next;
  }
  if (p.ndim > 0) offset += static_cast<std::int64_t>(rest) * p.strides[0];
  return offset * p.element_bytes + word * p.word_bytes;
}

// The launch: threads per block, and blocks (at most max_blocks; the
// grid-stride loop covers the rest).
struct gather_launch {
  int blocks = 0;
  int threads = 0;
};
inline constexpr int gather_threads = 256;
inline constexpr int gather_max_blocks = 65535;

DLASYNC_HOST_DEVICE inline gather_launch gather_geometry(std::int64_t count) {
  if (count <= 0) return {0, gather_threads};
  const std::int64_t wanted = (count + gather_threads - 1) / gather_threads;
  return {static_cast<int>(wanted < gather_max_blocks ? wanted : gather_max_blocks),
          gather_threads};
}

// The words thread `thread` of block `block` moves, in order: its first
// word, and the stride to its next ones (the grid-stride loop).
DLASYNC_HOST_DEVICE inline std::int64_t gather_first_word(const gather_launch& g, int block,
                                                          int thread) {
  return static_cast<std::int64_t>(block) * g.threads + thread;
}
DLASYNC_HOST_DEVICE inline std::int64_t gather_word_stride(const gather_launch& g) {
  return static_cast<std::int64_t>(g.blocks) * g.threads;
}

// The tiled transpose. A tile is gather_tile x gather_tile elements: rows
// r along the tile dimension (source stride 1), columns c along the last
// dimension (destination stride 1). A block is gather_tile x
// gather_tile_rows threads (x, y), and each thread moves gather_tile_passes
// elements in each phase. Shared slot c * gather_tile_pitch + r holds
// element (r, c) of the tile.
inline constexpr int gather_tile = 32;
inline constexpr int gather_tile_rows = 8;
inline constexpr int gather_tile_passes = gather_tile / gather_tile_rows;
inline constexpr int gather_tile_pitch = gather_tile + 1;  // no bank conflicts
inline constexpr int gather_tile_slots = gather_tile * gather_tile_pitch;
// Both tile dimensions at least this long, or the gather (whose reads are
// then nearly as coalesced, and whose threads all work).
inline constexpr std::int64_t gather_tile_min_extent = 16;

// The dimension the tiles run down, or -1 for the plain gather: the source
// is contiguous (stride 1) along a dimension other than the last, the last
// is not contiguous, broadcast or reversed-contiguous, both are long
// enough, and each element is one word. Other strides may be negative or
// zero (batches).
DLASYNC_HOST_DEVICE inline int gather_tile_dim(int ndim, const std::int64_t* shape,
                                               const std::int64_t* strides, int words_per_element) {
  if (words_per_element != 1 || ndim < 2) return -1;
  const int last = ndim - 1;
  const std::int64_t s = strides[last];
  if (s == 0 || s == 1 || s == -1 || shape[last] < gather_tile_min_extent) return -1;
  for (int d = last - 1; d >= 0; --d) {
    if (strides[d] == 1) return shape[d] >= gather_tile_min_extent ? d : -1;
  }
  return -1;
}

// Where a tile starts: its first element's source offset and destination
// index (in elements), and how many of its rows and columns exist (fewer
// than gather_tile at ragged edges).
struct gather_tile_origin {
  std::int64_t src = 0;
  std::int64_t dst = 0;
  int rows = 0;
  int cols = 0;
};

// Tile `tile` < p.tiles, numbered with columns fastest, then rows, then
// batches (the other dimensions, in row-major order).
DLASYNC_HOST_DEVICE inline gather_tile_origin gather_tile_at(std::int64_t tile,
                                                             const gather_params& p) {
  const int last = p.ndim - 1;
  const int row_dim = p.tile_dim;
  const auto t = static_cast<std::uint64_t>(tile);
  const std::uint64_t rows_and_batch = fast_divide(t, p.divide_by_tile_cols);
  const std::uint64_t tile_cols =
      static_cast<std::uint64_t>((p.shape[last] + gather_tile - 1) / gather_tile);
  const std::uint64_t tile_rows =
      static_cast<std::uint64_t>((p.shape[row_dim] + gather_tile - 1) / gather_tile);
  std::uint64_t batch = fast_divide(rows_and_batch, p.divide_by_tile_rows);
  const auto c0 = static_cast<std::int64_t>(t - rows_and_batch * tile_cols) * gather_tile;
  const auto r0 = static_cast<std::int64_t>(rows_and_batch - batch * tile_rows) * gather_tile;
  gather_tile_origin o;
  o.src = r0 + c0 * p.strides[last];
  o.dst = r0 * p.dst_strides[row_dim] + c0;
  // The batch dimensions, innermost first; the outermost one takes the
  // rest undivided.
  int outermost = 0;
  while (outermost == row_dim) ++outermost;
  for (int d = last - 1; d > outermost; --d) {
    if (d == row_dim) continue;
    const std::uint64_t next = fast_divide(batch, p.divide_by[d]);
    const auto index =
        static_cast<std::int64_t>(batch - next * static_cast<std::uint64_t>(p.shape[d]));
    o.src += index * p.strides[d];
    o.dst += index * p.dst_strides[d];
    batch = next;
  }
  if (outermost < last) {
    o.src += static_cast<std::int64_t>(batch) * p.strides[outermost];
    o.dst += static_cast<std::int64_t>(batch) * p.dst_strides[outermost];
  }
  const std::int64_t rows = p.shape[row_dim] - r0;
  const std::int64_t cols = p.shape[last] - c0;
  o.rows = static_cast<int>(rows < gather_tile ? rows : gather_tile);
  o.cols = static_cast<int>(cols < gather_tile ? cols : gather_tile);
  return o;
}

// One element a thread moves in one phase: between shared slot `slot` and
// the word at `at` (the load: a source byte offset from the first element;
// the store: a destination word index). slot is -1 past a ragged edge.
struct gather_tile_move {
  int slot = -1;
  std::int64_t at = 0;
};

// Phase 1, pass k: thread (x, y) loads element (r = x, c = y + k *
// gather_tile_rows), so a warp reads 32 consecutive source elements.
DLASYNC_HOST_DEVICE inline gather_tile_move gather_tile_load(const gather_tile_origin& o,
                                                             const gather_params& p, int x, int y,
                                                             int k) {
  const int r = x;
  const int c = y + k * gather_tile_rows;
  if (r >= o.rows || c >= o.cols) return {};
  return {c * gather_tile_pitch + r,
          (o.src + r + static_cast<std::int64_t>(c) * p.strides[p.ndim - 1]) * p.element_bytes};
}

// Phase 2, pass k: thread (x, y) stores element (r = y + k *
// gather_tile_rows, c = x), so a warp writes 32 consecutive destination
// elements and reads shared slots 33 apart (32 different banks).
DLASYNC_HOST_DEVICE inline gather_tile_move gather_tile_store(const gather_tile_origin& o,
                                                              const gather_params& p, int x, int y,
                                                              int k) {
  const int r = y + k * gather_tile_rows;
  const int c = x;
  if (r >= o.rows || c >= o.cols) return {};
  return {c * gather_tile_pitch + r,
          o.dst + static_cast<std::int64_t>(r) * p.dst_strides[p.tile_dim] + c};
}

// The tiles' launch: gather_tile x gather_tile_rows threads a block, a
// block a tile up to gather_max_blocks (the grid-stride loop covers the
// rest).
DLASYNC_HOST_DEVICE inline int gather_tile_blocks(std::int64_t tiles) {
  if (tiles <= 0) return 0;
  return static_cast<int>(tiles < gather_max_blocks ? tiles : gather_max_blocks);
}

}  // namespace dlasync::copy_kernels
