// The gather kernel's arithmetic (internal), one definition for the CUDA
// kernel (gather_kernel.cu, built by nvcc) and for the simulation and the
// tests (built by g++), so that CI runs the index math the GPU runs.
//
// The kernel moves words: each element is `words_per_element` words of
// `word_bytes` bytes, and destination word i comes from source byte offset
// gather_source_offset(i). The word size is the largest of 16, 8, 4, 2 and
// 1 that divides the element size and both base addresses: strides count
// whole elements, so every load and store is then aligned to its size (a
// misaligned one is a sticky cudaErrorMisalignedAddress on a GPU). Threads
// cover the words with a grid-stride loop over gather_geometry's grid.
//
// Plain C++17, no standard headers beyond <cstdint>: nvcc compiles it too.
#pragma once

#include <cstdint>

#include "dlasync/transfer/limits.hpp"

#if defined(__CUDACC__)
#define DLASYNC_HOST_DEVICE __host__ __device__
#else
#define DLASYNC_HOST_DEVICE
#endif

namespace dlasync::copy_kernels {

// Passed by value to the kernel: the source layout, strides in elements.
struct gather_params {
  std::int64_t count = 0;  // words to move: elements * words_per_element
  int ndim = 0;
  int word_bytes = 1;
  int words_per_element = 1;
  std::int64_t element_bytes = 1;
  std::int64_t shape[max_ndim] = {};
  std::int64_t strides[max_ndim] = {};
};

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

// Byte offset from the source's first element of destination word `i`
// (row-major order over the shape); negative and zero strides included.
DLASYNC_HOST_DEVICE inline std::int64_t gather_source_offset(std::int64_t i,
                                                             const gather_params& p) {
  const std::int64_t element = i / p.words_per_element;
  const std::int64_t word = i % p.words_per_element;
  std::int64_t rest = element;
  std::int64_t offset = 0;
  for (int d = p.ndim - 1; d >= 0; --d) {
    const std::int64_t index = rest % p.shape[d];
    rest /= p.shape[d];
    offset += index * p.strides[d];
  }
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

}  // namespace dlasync::copy_kernels
