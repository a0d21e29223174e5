#include "transfer/src/copy/strided_copy.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dlasync {
namespace {

// Runs copy this many bytes a unit, tiles this many rows.
constexpr std::int64_t run_unit_bytes = std::int64_t{256} << 10;
constexpr std::int64_t gather_unit_bytes = std::int64_t{64} << 10;
constexpr std::int64_t tile = 32;
// 2 KiB: half a page of a source row per visit. Measured against 512 B
// (docs/performance.md): 0.63 of memcpy against 0.40 for a 64 MiB
// transpose, the same at 1 MiB.
constexpr std::int64_t tile_run_bytes = 2048;
// From 32 MiB on, a whole page (4 KiB) of each source row per visit. Past
// the last-level cache the source side limits a tile: the same strided read
// pattern alone, side 16384, reads 12 GB/s in 2 KiB visits and 15 GB/s in
// 4 KiB ones (the hardware prefetchers stop at page ends, so each half-page
// visit starts a stream over). Paired against memcpy: 2-D 64 MiB 0.63 ->
// 0.69, 256 MiB 0.59 -> 0.65, 1 GiB 0.51 -> 0.58; 3-D 32 MiB 0.65 -> 0.73,
// 512 MiB 0.58 -> 0.62. At 16 MiB and below (in cache) the same, and 2 KiB
// keeps twice the units there for splitting a copy among threads. 8 KiB
// visits were slower (0.67 -> 0.55 at 1 GiB: twice the destination rows, and
// so pages, per unit).
constexpr std::int64_t tile_page_run_bytes = 4096;
constexpr std::uint64_t tile_page_run_min_bytes = std::uint64_t{32} << 20;
// Tiles write whole destination lines with streaming stores from this many
// bytes on: past the caches they save the read of each destination line
// before it is written (0.78 of memcpy against 0.35 at 16 MiB). So do runs
// of 256 bytes or more that read a small source many times (broadcast: 15.5
// GB/s against 8.6 at 16 MiB).
constexpr std::uint64_t stream_min_bytes = std::uint64_t{2} << 20;
constexpr std::int64_t line_bytes = 64;

template <std::size_t N>
inline void copy_element(char* dst, const char* src) {
  std::memcpy(dst, src, N);
}

#if defined(__SSE2__)
// 64 bytes to a 16-byte aligned `to` with streaming stores.
inline void stream_line(char* to, const char* from) {
  const auto* f = reinterpret_cast<const __m128i*>(from);
  auto* t = reinterpret_cast<__m128i*>(to);
  const __m128i a = _mm_loadu_si128(f);
  const __m128i b = _mm_loadu_si128(f + 1);
  const __m128i c = _mm_loadu_si128(f + 2);
  const __m128i e = _mm_loadu_si128(f + 3);
  _mm_stream_si128(t, a);
  _mm_stream_si128(t + 1, b);
  _mm_stream_si128(t + 2, c);
  _mm_stream_si128(t + 3, e);
}

// A tile's `lines` buffered lines (line_bytes apart in `buffer`) to
// destination rows `d_row` bytes apart, each written whole with streaming
// stores.
inline void stream_lines(char* d, std::int64_t d_row, const char* buffer, std::int64_t lines) {
  for (std::int64_t i = 0; i < lines; ++i) stream_line(d + i * d_row, buffer + i * line_bytes);
}
#endif

// Copies `n` bytes with streaming stores where the destination allows
// (16-byte aligned; the tail and unaligned runs by memcpy).
inline void stream_run(char* to, const char* from, std::size_t n) {
#if defined(__SSE2__)
  if ((reinterpret_cast<std::uintptr_t>(to) & 15) == 0) {
    std::size_t i = 0;
    for (; i + 64 <= n; i += 64) stream_line(to + i, from + i);
    if (i < n) std::memcpy(to + i, from + i, n - i);
    return;
  }
#endif
  std::memcpy(to, from, n);
}

// `count` runs of `n` bytes, `from_step` bytes apart in the source (any
// sign, 0 for a broadcast), one after another in the destination.
void copy_runs_memcpy(char* to, const char* from, std::size_t n, std::int64_t count,
                      std::int64_t from_step) {
  for (std::int64_t i = 0; i < count; ++i) {
    std::memcpy(to, from, n);
    to += n;
    from += from_step;
  }
}

#if defined(__x86_64__)
// The same in 32-byte registers, inline: a call to memcpy per 1 KiB row cost
// about a fifth of the copy at 1 MiB (0.77 of one memcpy of the same bytes,
// against 0.92 this way, in a standalone loop; docs/performance.md). The
// last piece of a run is its last 32 bytes, overlapping what came before.
// Runs of at least 32 bytes.
[[gnu::target("avx2")]] void copy_runs_avx2(char* to, const char* from, std::size_t n,
                                            std::int64_t count, std::int64_t from_step) {
  for (std::int64_t i = 0; i < count; ++i) {
    std::size_t k = 0;
    for (; k + 128 <= n; k += 128) {
      const auto* f = reinterpret_cast<const __m256i*>(from + k);
      auto* t = reinterpret_cast<__m256i*>(to + k);
      const __m256i a = _mm256_loadu_si256(f);
      const __m256i b = _mm256_loadu_si256(f + 1);
      const __m256i c = _mm256_loadu_si256(f + 2);
      const __m256i e = _mm256_loadu_si256(f + 3);
      _mm256_storeu_si256(t, a);
      _mm256_storeu_si256(t + 1, b);
      _mm256_storeu_si256(t + 2, c);
      _mm256_storeu_si256(t + 3, e);
    }
    for (; k + 32 <= n; k += 32) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + k),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + k)));
    }
    if (k < n) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + n - 32),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + n - 32)));
    }
    to += n;
    from += from_step;
  }
}

const bool cpu_has_avx2 = [] {
  __builtin_cpu_init();  // static initialization may run before libgcc's
  return __builtin_cpu_supports("avx2") != 0;
}();
#endif

// Whether the AVX2 kernels run (strided_copy::use_avx2; tests turn them off
// to check the portable ones on the same machine).
std::atomic<bool> avx2_allowed{true};

bool use_avx2() noexcept {
#if defined(__x86_64__)
  return cpu_has_avx2 && avx2_allowed.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void copy_runs(char* to, const char* from, std::size_t n, std::int64_t count,
               std::int64_t from_step) {
#if defined(__x86_64__)
  if (n >= 32 && use_avx2()) return copy_runs_avx2(to, from, n, count, from_step);
#endif
  copy_runs_memcpy(to, from, n, count, from_step);
}

// Square blocks of B x B elements of N bytes transposed in registers: from
// `src` rows `ss` bytes apart to `dst` rows `ds` bytes apart. B is 0 where
// there is no such kernel; the tile loop then copies element by element.
template <std::size_t N>
struct micro_transpose {
  static constexpr std::int64_t size = 0;
  static void run(const char*, std::int64_t, char*, std::int64_t) {}
};

#if defined(__SSE2__)
template <>
struct micro_transpose<4> {
  static constexpr std::int64_t size = 4;
  static void run(const char* s, std::int64_t ss, char* d, std::int64_t ds) {
    // Shuffles move bits unchanged, so any 4-byte data travels as floats.
    __m128 r0 = _mm_loadu_ps(reinterpret_cast<const float*>(s));
    __m128 r1 = _mm_loadu_ps(reinterpret_cast<const float*>(s + ss));
    __m128 r2 = _mm_loadu_ps(reinterpret_cast<const float*>(s + 2 * ss));
    __m128 r3 = _mm_loadu_ps(reinterpret_cast<const float*>(s + 3 * ss));
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(reinterpret_cast<float*>(d), r0);
    _mm_storeu_ps(reinterpret_cast<float*>(d + ds), r1);
    _mm_storeu_ps(reinterpret_cast<float*>(d + 2 * ds), r2);
    _mm_storeu_ps(reinterpret_cast<float*>(d + 3 * ds), r3);
  }
};

template <>
struct micro_transpose<8> {
  static constexpr std::int64_t size = 2;
  static void run(const char* s, std::int64_t ss, char* d, std::int64_t ds) {
    const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + ss));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm_unpacklo_epi64(r0, r1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + ds), _mm_unpackhi_epi64(r0, r1));
  }
};

template <>
struct micro_transpose<2> {
  static constexpr std::int64_t size = 8;
  static void run(const char* s, std::int64_t ss, char* d, std::int64_t ds) {
    __m128i a[8];
    for (std::int64_t i = 0; i < 8; ++i)
      a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * ss));
    __m128i b[8];
    for (std::int64_t i = 0; i < 4; ++i) {
      b[2 * i] = _mm_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
      b[2 * i + 1] = _mm_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    }
    const __m128i c0 = _mm_unpacklo_epi32(b[0], b[2]);
    const __m128i c1 = _mm_unpackhi_epi32(b[0], b[2]);
    const __m128i c2 = _mm_unpacklo_epi32(b[1], b[3]);
    const __m128i c3 = _mm_unpackhi_epi32(b[1], b[3]);
    const __m128i c4 = _mm_unpacklo_epi32(b[4], b[6]);
    const __m128i c5 = _mm_unpackhi_epi32(b[4], b[6]);
    const __m128i c6 = _mm_unpacklo_epi32(b[5], b[7]);
    const __m128i c7 = _mm_unpackhi_epi32(b[5], b[7]);
    const __m128i rows[8] = {_mm_unpacklo_epi64(c0, c4), _mm_unpackhi_epi64(c0, c4),
                             _mm_unpacklo_epi64(c1, c5), _mm_unpackhi_epi64(c1, c5),
                             _mm_unpacklo_epi64(c2, c6), _mm_unpackhi_epi64(c2, c6),
                             _mm_unpacklo_epi64(c3, c7), _mm_unpackhi_epi64(c3, c7)};
    for (int i = 0; i < 8; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i * ds), rows[i]);
  }
};
#endif

// Rows [r0, r1) of the tile dimension (source stride N bytes) against
// columns [c_begin, cols) of the last dimension (destination stride N
// bytes), in tile-wide column strips, with register transposes where there
// are some.
template <std::size_t N>
void transpose_rect(const char* s, std::int64_t s_col, char* d, std::int64_t d_row, std::int64_t r0,
                    std::int64_t r1, std::int64_t c_begin, std::int64_t cols) {
  constexpr std::int64_t b = micro_transpose<N>::size;
  constexpr auto n = static_cast<std::int64_t>(N);
  auto element = [&](std::int64_t r, std::int64_t c) {
    copy_element<N>(d + r * d_row + c * n, s + r * n + c * s_col);
  };
  for (std::int64_t c0 = c_begin; c0 < cols; c0 += tile) {
    const std::int64_t c1 = std::min(c0 + tile, cols);
    std::int64_t r = r0;
    if constexpr (b > 0) {
      for (; r + b <= r1; r += b) {
        std::int64_t c = c0;
        for (; c + b <= c1; c += b) {
          micro_transpose<N>::run(s + r * n + c * s_col, s_col, d + r * d_row + c * n, d_row);
        }
        for (std::int64_t rr = r; rr < r + b; ++rr) {
          for (std::int64_t cc = c; cc < c1; ++cc) element(rr, cc);
        }
      }
    }
    for (; r < r1; ++r) {
      for (std::int64_t c = c0; c < c1; ++c) element(r, c);
    }
  }
}

#if defined(__x86_64__)
// 8 x 8 elements of 4 bytes transposed in 32-byte registers: rows `ss`
// bytes apart in `s` to rows `ds` bytes apart in `d`.
[[gnu::target("avx2"), gnu::always_inline]] inline void transpose_8x8_avx2(const char* s,
                                                                           std::int64_t ss, char* d,
                                                                           std::int64_t ds) {
  __m256 r[8];
  for (std::ptrdiff_t i = 0; i < 8; ++i) {
    r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(s + i * ss));
  }
  __m256 t[8];
  for (std::ptrdiff_t i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 u[8];
  for (std::ptrdiff_t i = 0; i < 8; i += 4) {
    // Rows i..i+3: pairs from t[i], t[i + 2] and t[i + 1], t[i + 3].
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (std::ptrdiff_t i = 0; i < 4; ++i) {
    _mm256_storeu_ps(reinterpret_cast<float*>(d + i * ds),
                     _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(reinterpret_cast<float*>(d + (i + 4) * ds),
                     _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}

// The whole-line part of transpose_rows for 4-byte elements, rows [r0,
// r_end) and columns [0, c_end) in multiples of 16, with 8 x 8 register
// transposes. Without streaming stores each block goes straight to the
// destination (no pass through a buffer); with them, tiles of 16 x 16 go
// through a buffer in L1 as in transpose_rows, so that every line is
// written whole at once.
[[gnu::target("avx2")]] void transpose_lines_4_avx2(const char* s, std::int64_t s_col, char* d,
                                                    std::int64_t d_row, std::int64_t r0,
                                                    std::int64_t r_end, std::int64_t c_end,
                                                    bool stream) {
  constexpr std::int64_t l = 16;
  alignas(64) char buffer[l * line_bytes];
  for (std::int64_t c0 = 0; c0 < c_end; c0 += l) {
    for (std::int64_t r = r0; r < r_end; r += l) {
      if (!stream) {
        for (std::int64_t rr = 0; rr < l; rr += 8) {
          for (std::int64_t cc = 0; cc < l; cc += 8) {
            transpose_8x8_avx2(s + (r + rr) * 4 + (c0 + cc) * s_col, s_col,
                               d + (r + rr) * d_row + (c0 + cc) * 4, d_row);
          }
        }
        continue;
      }
      for (std::int64_t rr = 0; rr < l; rr += 8) {
        for (std::int64_t cc = 0; cc < l; cc += 8) {
          transpose_8x8_avx2(s + (r + rr) * 4 + (c0 + cc) * s_col, s_col,
                             buffer + rr * line_bytes + cc * 4, line_bytes);
        }
      }
      stream_lines(d + r * d_row + c0 * 4, d_row, buffer, l);
    }
  }
}
#endif

// transpose_rect over all columns, by whole cache lines where it can: a
// square of one line's worth of elements (16 floats) is read line by line
// from the source, transposed through a buffer in L1, and written line by
// line to the destination. Reading and writing whole lines at once keeps
// power-of-two row strides, whose lines compete for the same cache sets,
// from evicting a line before it is used up.
template <std::size_t N>
void transpose_rows(const char* s, std::int64_t s_col, char* d, std::int64_t d_row, std::int64_t r0,
                    std::int64_t r1, std::int64_t cols, bool stream) {
  constexpr std::int64_t b = micro_transpose<N>::size;
  if constexpr (b > 0 && N <= 16) {
    stream = stream &&
             ((reinterpret_cast<std::uintptr_t>(d) | static_cast<std::uintptr_t>(d_row)) & 15) == 0;
    constexpr auto n = static_cast<std::int64_t>(N);
    constexpr std::int64_t l = line_bytes / n;  // elements per line
    const std::int64_t r_end = r0 + (r1 - r0) / l * l;
    const std::int64_t c_end = cols / l * l;
#if defined(__x86_64__)
    if constexpr (N == 4) {
      if (use_avx2()) {
        transpose_lines_4_avx2(s, s_col, d, d_row, r0, r_end, c_end, stream);
        if (c_end < cols) transpose_rect<N>(s, s_col, d, d_row, r0, r_end, c_end, cols);
        if (r_end < r1) transpose_rect<N>(s, s_col, d, d_row, r_end, r1, 0, cols);
        return;
      }
    }
#endif
    alignas(64) char buffer[l * line_bytes];
    for (std::int64_t c0 = 0; c0 < c_end; c0 += l) {
      for (std::int64_t r = r0; r < r_end; r += l) {
        for (std::int64_t cc = 0; cc < l; cc += b) {
          for (std::int64_t rr = 0; rr < l; rr += b) {
            micro_transpose<N>::run(s + (r + rr) * n + (c0 + cc) * s_col, s_col,
                                    buffer + rr * line_bytes + cc * n, line_bytes);
          }
        }
        if (stream) {
#if defined(__SSE2__)
          stream_lines(d + r * d_row + c0 * n, d_row, buffer, l);
#endif
        } else {
          for (std::int64_t rr = 0; rr < l; ++rr) {
            std::memcpy(d + (r + rr) * d_row + c0 * n, buffer + rr * line_bytes, line_bytes);
          }
        }
      }
    }
    // The edges: the last columns of these rows, and the last rows.
    if (c_end < cols) transpose_rect<N>(s, s_col, d, d_row, r0, r_end, c_end, cols);
    if (r_end < r1) transpose_rect<N>(s, s_col, d, d_row, r_end, r1, 0, cols);
  } else {
    transpose_rect<N>(s, s_col, d, d_row, r0, r1, 0, cols);
  }
}

}  // namespace

void strided_copy::allow_avx2(bool allowed) noexcept {
  avx2_allowed.store(allowed, std::memory_order_relaxed);
}

strided_copy::strided_copy(const strided_layout& layout, std::uint64_t max_unit_bytes)
    : element_size_(layout.element_size) {
  const std::int64_t es = static_cast<std::int64_t>(element_size_);
  std::uint64_t count = 1;
  for (std::int64_t e : layout.shape) count *= static_cast<std::uint64_t>(e);
  bytes_ = count * element_size_;
  if (count == 0) return;  // kernel none, no units

  // Keep extents above 1, merging a dimension into the next inner one when
  // the source is contiguous across them (the destination always is).
  for (std::size_t i = 0; i < layout.shape.size(); ++i) {
    if (layout.shape[i] == 1) continue;
    const std::int64_t stride = layout.strides[i] * es;
    if (!shape_.empty() && src_stride_.back() == stride * layout.shape[i]) {
      shape_.back() *= layout.shape[i];
      src_stride_.back() = stride;
    } else {
      shape_.push_back(layout.shape[i]);
      src_stride_.push_back(stride);
    }
  }
  if (shape_.empty()) {  // a single element
    shape_.push_back(1);
    src_stride_.push_back(es);
  }
  ndim_ = static_cast<int>(shape_.size());
  dst_stride_.resize(shape_.size());
  std::int64_t d = es;
  for (int i = ndim_ - 1; i >= 0; --i) {
    dst_stride_[i] = d;
    d *= shape_[i];
  }

  const int last = ndim_ - 1;
  if (src_stride_[last] == es) {
    kernel_ = kernel::runs;
  } else {
    // Tiles have kernels for the element sizes of real dtypes.
    const bool sized = es == 1 || es == 2 || es == 4 || es == 8 || es == 16;
    for (int i = last - 1; i >= 0 && sized; --i) {
      if (src_stride_[i] == es && shape_[i] >= 8 && shape_[last] >= 8) {
        tile_dim_ = i;
        break;
      }
    }
    kernel_ = tile_dim_ >= 0 ? kernel::tile : kernel::gather;
  }

  if (kernel_ == kernel::tile) {
    // Each unit reads tile_run_bytes (a page past the caches) from every
    // source row it visits, so a visit to a far-away row (often another
    // page) brings several lines.
    split_dim_ = tile_dim_;
    const std::int64_t run =
        bytes_ >= tile_page_run_min_bytes ? tile_page_run_bytes : tile_run_bytes;
    block_ = std::max<std::int64_t>(tile, run / es);
  } else {
    split_dim_ = last;
    std::int64_t unit = kernel_ == kernel::runs ? run_unit_bytes : gather_unit_bytes;
    if (max_unit_bytes != 0) unit = std::min(unit, static_cast<std::int64_t>(max_unit_bytes));
    block_ = std::max<std::int64_t>(1, unit / es);
  }
  block_ = std::min(block_, shape_[split_dim_]);
  blocks_ = (shape_[split_dim_] + block_ - 1) / block_;
  outer_count_ = 1;
  for (int i = 0; i < split_dim_; ++i) {
    outer_dims_.push_back(i);
    outer_count_ *= shape_[i];
  }
  if (kernel_ == kernel::runs) {
    // Runs stream only when they read far less than they write (broadcast:
    // the source stays in cache, and writes are the whole cost). Where the
    // source streams from memory too, streaming stores measured slower
    // (docs/performance.md).
    std::int64_t span = es;
    for (int i = 0; i < ndim_; ++i) span += (shape_[i] - 1) * std::abs(src_stride_[i]);
    stream_ = bytes_ >= stream_min_bytes && shape_[last] * es >= 256 &&
              static_cast<std::uint64_t>(span) * 4 <= bytes_;
  }
  if (kernel_ == kernel::tile) {
    stream_ = bytes_ >= stream_min_bytes;
    std::int64_t row_bytes = shape_[last] * es;
    for (int i = split_dim_ + 1; i < last; ++i) {
      middle_dims_.push_back(i);
      row_bytes *= shape_[i];
    }
    if (max_unit_bytes != 0) {
      const auto rows = static_cast<std::int64_t>(max_unit_bytes) / row_bytes;
      block_ = std::max<std::int64_t>(1, std::min(block_, rows));
      blocks_ = (shape_[split_dim_] + block_ - 1) / block_;
    }
  }
}

std::uint64_t strided_copy::dst_offset(std::int64_t unit) const noexcept {
  if (blocks_ == 0) return 0;
  const std::int64_t row = dst_stride_[split_dim_];
  const std::int64_t outer = unit / blocks_;
  const std::int64_t first = std::min((unit % blocks_) * block_, shape_[split_dim_]);
  return static_cast<std::uint64_t>(outer * shape_[split_dim_] * row + first * row);
}

std::uint64_t strided_copy::unit_bytes() const noexcept {
  if (units() == 0) return 0;
  return bytes_ / static_cast<std::uint64_t>(units());
}

void strided_copy::run(const void* src, void* dst, std::int64_t begin, std::int64_t end,
                       std::uint64_t dst_origin) const {
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  const auto origin = static_cast<std::int64_t>(dst_origin);
  switch (element_size_) {
    case 1: return run_sized<1>(s, d, begin, end, origin);
    case 2: return run_sized<2>(s, d, begin, end, origin);
    case 4: return run_sized<4>(s, d, begin, end, origin);
    case 8: return run_sized<8>(s, d, begin, end, origin);
    case 16: return run_sized<16>(s, d, begin, end, origin);
    default: return run_sized<0>(s, d, begin, end, origin);
  }
}

template <std::size_t N>
void strided_copy::run_sized(const char* src, char* dst, std::int64_t begin, std::int64_t end,
                             std::int64_t dst_origin) const {
  if (begin >= end || kernel_ == kernel::none) return;
  const std::size_t es = N != 0 ? N : element_size_;
  auto copy_one = [es](char* to, const char* from) {
    if constexpr (N != 0) {
      copy_element<N>(to, from);
      (void)es;
    } else {
      std::memcpy(to, from, es);
    }
  };

  // Position the outer odometer at unit `begin`.
  const int outer = static_cast<int>(outer_dims_.size());
  std::int64_t index[max_ndim] = {};
  std::int64_t flat = begin / blocks_;
  std::int64_t block = begin % blocks_;
  std::int64_t src_off = 0;
  std::int64_t dst_off = -dst_origin;
  for (int j = outer - 1; j >= 0; --j) {
    const int dim = outer_dims_[j];
    index[j] = flat % shape_[dim];
    flat /= shape_[dim];
    src_off += index[j] * src_stride_[dim];
    dst_off += index[j] * dst_stride_[dim];
  }

  // Moves the outer odometer `count` on in its innermost dimension (at most
  // to that dimension's end), carrying into the dimensions outside it.
  auto step_outer = [&](std::int64_t count) {
    for (int j = outer - 1; j >= 0; --j) {
      const int dim = outer_dims_[j];
      src_off += count * src_stride_[dim];
      dst_off += count * dst_stride_[dim];
      index[j] += count;
      if (index[j] < shape_[dim]) break;
      src_off -= index[j] * src_stride_[dim];
      dst_off -= index[j] * dst_stride_[dim];
      index[j] = 0;
      count = 1;
    }
  };

  const int last = ndim_ - 1;
  const std::int64_t extent = shape_[split_dim_];
  if (kernel_ == kernel::runs && blocks_ == 1 && !stream_) {
    // Whole runs, a unit each: the runs along the innermost outer dimension
    // go in one call (copy_runs), the odometer then steps past them.
    const auto n = static_cast<std::size_t>(extent) * es;
    for (std::int64_t u = begin; u < end;) {
      std::int64_t count = 1;
      std::int64_t step = 0;
      if (outer > 0) {
        const int dim = outer_dims_[outer - 1];
        count = std::min(end - u, shape_[dim] - index[outer - 1]);
        step = src_stride_[dim];
      }
      copy_runs(dst + dst_off, src + src_off, n, count, step);
      u += count;
      step_outer(count);
    }
    return;
  }
  for (std::int64_t u = begin; u < end; ++u) {
    const std::int64_t lo = block * block_;
    const std::int64_t hi = std::min(lo + block_, extent);
    const char* s = src + src_off;
    char* d = dst + dst_off;
    if (kernel_ == kernel::runs) {
      char* to = d + lo * static_cast<std::int64_t>(es);
      const char* from = s + lo * static_cast<std::int64_t>(es);
      const auto n = static_cast<std::size_t>(hi - lo) * es;
      if (stream_) {
        stream_run(to, from, n);
      } else {
        std::memcpy(to, from, n);
      }
    } else if (kernel_ == kernel::gather) {
      const std::int64_t ss = src_stride_[last];
      for (std::int64_t i = lo; i < hi; ++i) {
        copy_one(d + i * static_cast<std::int64_t>(es), s + i * ss);
      }
    } else if constexpr (N != 0) {
      // Rows [r0, r1): one (tile, last) plane for each index of the middle
      // dimensions.
      auto rows = [&](std::int64_t r0, std::int64_t r1) {
        const int middle = static_cast<int>(middle_dims_.size());
        std::int64_t mid[max_ndim] = {};
        std::int64_t mid_src = 0;
        std::int64_t mid_dst = 0;
        while (true) {
          transpose_rows<N>(s + mid_src, src_stride_[last], d + mid_dst, dst_stride_[tile_dim_], r0,
                            r1, shape_[last], stream_);
          int j = middle - 1;
          for (; j >= 0; --j) {
            const int dim = middle_dims_[j];
            mid_src += src_stride_[dim];
            mid_dst += dst_stride_[dim];
            if (++mid[j] < shape_[dim]) break;
            mid_src -= mid[j] * src_stride_[dim];
            mid_dst -= mid[j] * dst_stride_[dim];
            mid[j] = 0;
          }
          if (j < 0) break;
        }
      };
      // Units of a page of each source row, several of them in this range:
      // walked together, in pieces of block_ rows that start where the
      // source's pages do (the first source row's; every row's where the
      // row stride is a multiple of a page), so that no visit splits a page
      // between two visits far apart. A source a line past a page start (as
      // large aligned allocations are): 2-D 256 MiB 0.66 -> 0.70 of memcpy,
      // 1 GiB 0.58 -> 0.62; 3-D 512 MiB 0.62 -> 0.65. A range of one unit
      // (the workers' cancellable steps) is walked as it is.
      const std::int64_t take = std::min(end - u, blocks_ - block);
      const auto at = reinterpret_cast<std::uintptr_t>(s + lo * static_cast<std::int64_t>(N));
      if (take > 1 && block_ * static_cast<std::int64_t>(N) == tile_page_run_bytes &&
          at % line_bytes == 0) {
        const std::int64_t all_hi = std::min((block + take) * block_, extent);
        const auto to_page = static_cast<std::int64_t>(
            (tile_page_run_bytes - at % tile_page_run_bytes) % tile_page_run_bytes / N);
        std::int64_t r = lo;
        if (to_page > 0) {
          rows(r, r + to_page);
          r += to_page;
        }
        for (; r < all_hi; r += block_) rows(r, std::min(r + block_, all_hi));
        u += take - 1;
        block += take - 1;
      } else {
        rows(lo, hi);
      }
    }
    if (++block == blocks_) {
      block = 0;
      step_outer(1);
    }
  }
#if defined(__SSE2__)
  // Streaming stores are weakly ordered: they are made visible before the
  // copy reports its end.
  if (stream_) _mm_sfence();
#endif
}

}  // namespace dlasync
