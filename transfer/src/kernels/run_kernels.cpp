// Runs: contiguous source bytes copied to the next place in the destination.

#include <cstring>

#include "transfer/src/kernels/copy_kernels.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dlasync::copy_kernels {
namespace {

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
#endif

}  // namespace

void stream_run(char* to, const char* from, std::size_t n) {
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

// Past the caches, reading a source that streams from memory, the inline
// loop lost to a call to memcpy per run on a Zen 5 core: 1 KiB runs of every
// other source KiB, 256 MiB, 6.5 against 13.8 GB/s (0.42 and 0.86 of one
// memcpy of the same bytes); 16 MiB, 0.57 against 0.66. In cache it is the
// faster one (1 MiB: 1.04 against 0.99 there; 0.92 against 0.77 on a Xeon),
// and so it is where the source is one small block read again and again
// (a broadcast), at any size: there the stores are the whole cost, and the
// inline ones beat the memcpy calls (strided_copy.cpp). On the Xeon, past
// the caches, the memcpy loop measured within 0.05 of the inline one
// (docs/performance.md).
void copy_runs(char* to, const char* from, std::size_t n, std::int64_t count,
               std::int64_t from_step, bool in_registers) {
#if defined(__x86_64__)
  if (in_registers && n >= 32 && avx2()) return copy_runs_avx2(to, from, n, count, from_step);
#endif
  copy_runs_memcpy(to, from, n, count, from_step);
}

}  // namespace dlasync::copy_kernels
