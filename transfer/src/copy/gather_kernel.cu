// dlasync's compaction kernel: gathers a strided device tensor into compact
// row-major order. One thread per destination word, grid-stride loop;
// words of 1, 2, 4, 8 or 16 bytes, as aligned as source and destination
// allow (gather_math.hpp holds the arithmetic, shared with the simulation).
#include <cuda_runtime.h>

#include <cstdint>

#include "transfer/src/copy/gather_kernel.hpp"

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

struct alignas(16) word16 {
  std::uint64_t lo, hi;
};

template <typename Word>
cudaError_t launch(const cudaLaunchConfig_t& config, char* dst, const char* src,
                   const gather_params& p) {
  return cudaLaunchKernelEx(&config, gather<Word>, dst, src, p);
}

}  // namespace

cudaError_t launch_gather_kernel(void* dst, const void* src, const gather_params& p,
                                 cudaStream_t stream) {
  if (p.count == 0) return cudaSuccess;
  const gather_launch g = gather_geometry(p.count);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(g.blocks));
  config.blockDim = dim3(static_cast<unsigned>(g.threads));
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
