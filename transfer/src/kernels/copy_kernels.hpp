#pragma once

// The inner loops under strided_copy (strided_copy.cpp walks the units):
// runs of contiguous source bytes (run_kernels.cpp), and tiles that
// transpose the last dimension against one whose source stride is an
// element (tile_kernels.cpp). Which instruction set a kernel uses is chosen
// here, at run time, from the CPU.

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace dlasync::copy_kernels {

inline constexpr std::int64_t line_bytes = 64;
// Tiles copy in strips of this many columns where there is no register
// transpose for the element size.
inline constexpr std::int64_t tile = 32;

// Whether runs and 4-byte tiles may use AVX2, and 4-byte tiles AVX-512,
// where the CPU has them (the defaults); the tests turn them off to check
// the other kernels on the same machine.
void allow_avx2(bool allowed) noexcept;
void allow_avx512(bool allowed) noexcept;

// Whether the AVX2 kernels run: the CPU has AVX2 and the tests allow it.
bool avx2() noexcept;

// Whether large copies write with streaming stores: on CPUs other than
// AMD's. On a Xeon they measured faster past the caches (broadcast 16 MiB:
// 15.5 GB/s against 8.6; tiles 0.78 of memcpy against 0.35), on a Zen 5
// core slower (broadcast 16 MiB: 39.5 GB/s against 61.2; 256 MiB 17.2
// against 26.8; tiles at 16 MiB 0.11 of memcpy against 0.34), standalone.
// allow_streaming(true) turns them on anywhere (the tests, which check
// those paths on every machine); false returns to the CPU's choice.
bool streaming_stores() noexcept;
void allow_streaming(bool everywhere) noexcept;

// Whether 4-byte tiles are transposed 16 x 16 in 64-byte registers: on CPUs
// with AVX-512 that are not Intel's. Intel's Skylake-generation server cores
// lower their clock for 512-bit work (glibc's string functions stay off
// AVX-512 there for that reason), and this project's Intel measurements are
// of the AVX2 tiles; the AMD ones (Zen 5) are of both (docs/performance.md).
bool avx512_tiles() noexcept;

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
void stream_run(char* to, const char* from, std::size_t n);

// `count` runs of `n` bytes, `from_step` bytes apart in the source (any
// sign, 0 for a broadcast), one after another in the destination.
// `in_registers`: runs are copied inline in registers (a copy that fits the
// core's caches, or a small source read many times); otherwise each run is
// a call to memcpy (see run_kernels.cpp).
void copy_runs(char* to, const char* from, std::size_t n, std::int64_t count,
               std::int64_t from_step, bool in_registers);

// How a tile walk writes and reads ahead.
struct tile_options {
  bool stream = false;    // whole destination lines with streaming stores
  bool prefetch = false;  // software prefetches (the AVX-512 tiles, past the caches)
};

// Transposes rows [r0, r1) of the tile dimension (source stride N bytes)
// against all `cols` columns of the last dimension (source stride `s_col`,
// destination stride N; the destination's row stride is `d_row`).
// Instantiated for N of 1, 2, 4, 8 and 16.
template <std::size_t N>
void transpose_rows(const char* s, std::int64_t s_col, char* d, std::int64_t d_row, std::int64_t r0,
                    std::int64_t r1, std::int64_t cols, tile_options options);

}  // namespace dlasync::copy_kernels
