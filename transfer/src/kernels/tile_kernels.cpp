// Tiles: the last dimension transposed against one whose source stride is
// an element, a square of a cache line's worth of elements at a time.

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "transfer/src/kernels/copy_kernels.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif
#if defined(__x86_64__)
// GCC 12 warns that the AVX-512 shuffles' undefined source operand "may be
// used uninitialized" (GCC bug 105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace dlasync::copy_kernels {
namespace {

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

#if defined(__x86_64__)
// 16 x 16 elements of 4 bytes transposed in 64-byte registers: a line of
// 16 source rows (`ss` bytes apart) in, a line of 16 destination rows (`ds`
// bytes apart) out. Unpacks pair rows within 16-byte lanes, then lanes move
// across registers in two rounds.
//
// `Rolled` hides the trip count from the optimizer (an empty asm), so the
// loops stay loops at any -O level and the arrays live in L1; otherwise
// they are unrolled into registers. On a Zen 5 core (standalone, side n
// square transposes, 1 KiB tiles) registers won with short rows and lost
// with long ones: n = 64 (256-byte rows) 0.72 of memcpy against 0.33, 128
// 0.50 against 0.33, 256 0.22 against 0.30, 512 0.20 against 0.47. Why
// long rows slow the unrolled form down is not known.
// (With the trip count hidden, GCC cannot see that every element of the
// arrays is written before it is read, and says "may be used
// uninitialized"; every loop runs to 16.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <bool Rolled>
[[gnu::target("avx512f"), gnu::always_inline]] inline void transpose_16x16_avx512(const char* s,
                                                                                  std::int64_t ss,
                                                                                  char* d,
                                                                                  std::int64_t ds) {
  std::ptrdiff_t n = 16;
  if constexpr (Rolled) asm("" : "+r"(n));
  __m512 r[16];
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    r[i] = _mm512_loadu_ps(reinterpret_cast<const float*>(s + i * ss));
  }
  __m512 t[16];
  for (std::ptrdiff_t i = 0; i < n; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // u[4g + j], lane L: column 4L + j of rows 4g..4g+3.
  __m512 u[16];
  for (std::ptrdiff_t i = 0; i < n; i += 4) {
    u[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // Column 4L + j is lane L of u[j], u[4 + j], u[8 + j] and u[12 + j]:
  // lanes 0 and 2 (0x88), or 1 and 3 (0xDD), of two registers, twice.
  for (std::ptrdiff_t j = 0; j < n / 4; ++j) {
    const __m512 even_lo = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x88);
    const __m512 odd_lo = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xDD);
    const __m512 even_hi = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x88);
    const __m512 odd_hi = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xDD);
    _mm512_storeu_ps(reinterpret_cast<float*>(d + j * ds),
                     _mm512_shuffle_f32x4(even_lo, even_hi, 0x88));
    _mm512_storeu_ps(reinterpret_cast<float*>(d + (4 + j) * ds),
                     _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88));
    _mm512_storeu_ps(reinterpret_cast<float*>(d + (8 + j) * ds),
                     _mm512_shuffle_f32x4(even_lo, even_hi, 0xDD));
    _mm512_storeu_ps(reinterpret_cast<float*>(d + (12 + j) * ds),
                     _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xDD));
  }
}
#pragma GCC diagnostic pop

// Rows of up to this many bytes (source or destination) get the unrolled
// 16 x 16 transposes, longer ones the rolled (see above).
constexpr std::int64_t unrolled_tile_max_row_bytes = 512;

// The whole-line part of transpose_rows for 4-byte elements in 16 x 16
// register transposes, each a line of 16 source rows in and a line of 16
// destination rows out, stored directly. With `prefetch`, each tile asks
// for the lines of the tile two ahead in the walk: its 16 source lines,
// and its 16 destination lines for writing. Measured on a Zen 5 core
// (paired with memcpy, standalone, sides 512 to 16384): the 8 x 8 AVX2
// tiles reached 0.15 to 0.35 of memcpy there, these 0.32 to 0.47, and with
// the prefetches 0.44 to 0.59 past the caches; in them the prefetches cost
// (0.43 -> 0.33 at 1 MiB). Streaming stores were slower at power-of-two
// sides (0.11 against 0.34 at 16 MiB), so this path has none.
template <bool Rolled>
[[gnu::target("avx512f,prfchw")]] void transpose_lines_4_avx512(const char* s, std::int64_t s_col,
                                                                char* d, std::int64_t d_row,
                                                                std::int64_t r0, std::int64_t r_end,
                                                                std::int64_t c_end, bool prefetch) {
  constexpr std::int64_t l = 16;
  constexpr std::int64_t ahead = 2 * l;
  const std::int64_t span = r_end - r0;
  for (std::int64_t c0 = 0; c0 < c_end; c0 += l) {
    for (std::int64_t r = r0; r < r_end; r += l) {
      if (prefetch) {
        std::int64_t rn = r + ahead;
        std::int64_t cn = c0;
        if (rn >= r_end) {
          rn -= span;
          cn += l;
        }
        if (cn < c_end && rn >= r0 && rn < r_end) {
          for (std::int64_t i = 0; i < l; ++i) {
            __builtin_prefetch(s + rn * 4 + (cn + i) * s_col, 0, 3);
            __builtin_prefetch(d + (rn + i) * d_row + cn * 4, 1, 3);
          }
        }
      }
      transpose_16x16_avx512<Rolled>(s + r * 4 + c0 * s_col, s_col, d + r * d_row + c0 * 4, d_row);
    }
  }
}
#endif

}  // namespace

// transpose_rect over all columns, by whole cache lines where it can: a
// square of one line's worth of elements (16 floats) is read line by line
// from the source, transposed through a buffer in L1, and written line by
// line to the destination. Reading and writing whole lines at once keeps
// power-of-two row strides, whose lines compete for the same cache sets,
// from evicting a line before it is used up.
template <std::size_t N>
void transpose_rows(const char* s, std::int64_t s_col, char* d, std::int64_t d_row, std::int64_t r0,
                    std::int64_t r1, std::int64_t cols, tile_options options) {
  constexpr std::int64_t b = micro_transpose<N>::size;
  if constexpr (b > 0 && N <= 16) {
    const bool stream =
        options.stream &&
        ((reinterpret_cast<std::uintptr_t>(d) | static_cast<std::uintptr_t>(d_row)) & 15) == 0;
    constexpr auto n = static_cast<std::int64_t>(N);
    constexpr std::int64_t l = line_bytes / n;  // elements per line
    const std::int64_t r_end = r0 + (r1 - r0) / l * l;
    const std::int64_t c_end = cols / l * l;
    // The whole lines, in registers where the CPU allows (4-byte elements),
    // else through the buffer below; then the edges, the same for all.
    bool lines_done = false;
#if defined(__x86_64__)
    if constexpr (N == 4) {
      if (avx512_tiles()) {
        if (std::max(std::abs(s_col), std::abs(d_row)) <= unrolled_tile_max_row_bytes) {
          transpose_lines_4_avx512<false>(s, s_col, d, d_row, r0, r_end, c_end, options.prefetch);
        } else {
          transpose_lines_4_avx512<true>(s, s_col, d, d_row, r0, r_end, c_end, options.prefetch);
        }
        lines_done = true;
      } else if (avx2()) {
        transpose_lines_4_avx2(s, s_col, d, d_row, r0, r_end, c_end, stream);
        lines_done = true;
      }
    }
#endif
    if (!lines_done) {
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
    }
    // The edges: the last columns of these rows, and the last rows.
    if (c_end < cols) transpose_rect<N>(s, s_col, d, d_row, r0, r_end, c_end, cols);
    if (r_end < r1) transpose_rect<N>(s, s_col, d, d_row, r_end, r1, 0, cols);
  } else {
    (void)options;
    transpose_rect<N>(s, s_col, d, d_row, r0, r1, 0, cols);
  }
}

template void transpose_rows<1>(const char*, std::int64_t, char*, std::int64_t, std::int64_t,
                                std::int64_t, std::int64_t, tile_options);
template void transpose_rows<2>(const char*, std::int64_t, char*, std::int64_t, std::int64_t,
                                std::int64_t, std::int64_t, tile_options);
template void transpose_rows<4>(const char*, std::int64_t, char*, std::int64_t, std::int64_t,
                                std::int64_t, std::int64_t, tile_options);
template void transpose_rows<8>(const char*, std::int64_t, char*, std::int64_t, std::int64_t,
                                std::int64_t, std::int64_t, tile_options);
template void transpose_rows<16>(const char*, std::int64_t, char*, std::int64_t, std::int64_t,
                                 std::int64_t, std::int64_t, tile_options);

}  // namespace dlasync::copy_kernels
