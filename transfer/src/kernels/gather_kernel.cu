// dlasync's compaction kernels: gather a strided device tensor into compact
// row-major order, in words of 1, 2, 4, 8 or 16 bytes, as aligned as source
// and destination allow (gather_math.hpp holds the arithmetic, shared with
// the simulation, and describes both kernels).
//
// gather: one thread per destination word, grid-stride loop. Stores are
//   coalesced; loads follow the source's strides.
// gather_tiles: transposes (the source contiguous along a dimension other
//   than the destination's last). A plain gather would read each element
//   from a different 32-byte sector; instead each block stages 32 x 32
//   elements in shared memory: loaded with a warp on 32 consecutive source
//   elements, stored with a warp on 32 consecutive destination elements,
//   a __syncthreads between. The tile's pitch of 33 words keeps the
//   second phase's column reads free of bank conflicts.
#include <cuda_runtime.h>

#include <cstdint>

#include "transfer/src/kernels/gather_kernel.hpp"

namespace dlasync::copy_kernels {
namespace {

template <typename Word>
__global__ void gather(char* dst, const char* src, gather_params p) {
  const gather_launch g{static_cast<int>(gridDim.x), static_cast<int>(blockDim.x)};
  const std::int64_t stride = gather_word_stride(g);
  for (std::int64_t i =
           gather_first_word(g, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x));
       i < p.count; i += stride) {
    reinterpret_cast<Word*>(dst)[i] =
        *reinterpret_cast<const Word*>(src + gather_source_offset(i, p));
  }
}

template <typename Word>
__global__ void __launch_bounds__(gather_tile* gather_tile_rows)
    gather_tiles(char* dst, const char* src, gather_params p) {
  __shared__ Word tile[gather_tile_slots];
  const int x = static_cast<int>(threadIdx.x);
  const int y = static_cast<int>(threadIdx.y);
  for (std::int64_t t = blockIdx.x; t < p.tiles; t += gridDim.x) {
    const gather_tile_origin o = gather_tile_at(t, p);
#pragma unroll
    for (int k = 0; k < gather_tile_passes; ++k) {
      const gather_tile_move m = gather_tile_load(o, p, x, y, k);
      if (m.slot >= 0) tile[m.slot] = *reinterpret_cast<const Word*>(src + m.at);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < gather_tile_passes; ++k) {
      const gather_tile_move m = gather_tile_store(o, p, x, y, k);
      if (m.slot >= 0) reinterpret_cast<Word*>(dst)[m.at] = tile[m.slot];
    }
    __syncthreads();  // the tile is free for the block's next one
  }
}

struct alignas(16) word16 {
  std::uint64_t lo, hi;
};

template <typename Word>
cudaError_t launch(const cudaLaunchConfig_t& config, char* dst, const char* src,
                   const gather_params& p) {
  if (p.tile_dim >= 0) return cudaLaunchKernelEx(&config, gather_tiles<Word>, dst, src, p);
  return cudaLaunchKernelEx(&config, gather<Word>, dst, src, p);
}

}  // namespace

cudaError_t launch_gather_kernel(void* dst, const void* src, const gather_params& p,
                                 cudaStream_t stream) {
  if (p.count == 0) return cudaSuccess;
  cudaLaunchConfig_t config = {};
  if (p.tile_dim >= 0) {
    config.gridDim = dim3(static_cast<unsigned>(gather_tile_blocks(p.tiles)));
    config.blockDim = dim3(gather_tile, gather_tile_rows);
  } else {
    const gather_launch g = gather_geometry(p.count);
    config.gridDim = dim3(static_cast<unsigned>(g.blocks));
    config.blockDim = dim3(static_cast<unsigned>(g.threads));
  }
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  switch (p.word_bytes) {
    case 1: return launch<std::uint8_t>(config, d, s, p);
    case 2: return launch<std::uint16_t>(config, d, s, p);
    case 4: return launch<std::uint32_t>(config, d, s, p);
    case 8: return launch<std::uint64_t>(config, d, s, p);
    case 16: return launch<word16>(config, d, s, p);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace dlasync::copy_kernels
