// dlasync's compaction kernel: gathers a strided device tensor into compact
// row-major order. One thread per destination element, grid-stride loop;
// elements move as 1, 2, 4, 8 or 16-byte words.
#include <cuda_runtime.h>

#include <cstdint>

#include "transfer/src/copy/gather_kernel.hpp"

namespace dlasync::copy_kernels {
namespace {

template <typename Word>
__global__ void gather(char* dst, const char* src, gather_params p) {
  const std::int64_t stride = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < p.count; i += stride) {
    std::int64_t rest = i;
    std::int64_t offset = 0;
    for (int d = p.ndim - 1; d >= 0; --d) {
      const std::int64_t index = rest % p.shape[d];
      rest /= p.shape[d];
      offset += index * p.strides[d];
    }
    reinterpret_cast<Word*>(dst)[i] = *reinterpret_cast<const Word*>(src + offset * sizeof(Word));
  }
}

struct alignas(16) word16 {
  std::uint64_t lo, hi;
};

}  // namespace

cudaError_t launch_gather_kernel(void* dst, const void* src, const gather_params& p,
                                 int element_size, cudaStream_t stream) {
  if (p.count == 0) return cudaSuccess;
  const int threads = 256;
  const std::int64_t wanted = (p.count + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 65535 ? wanted : 65535);
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  switch (element_size) {
    case 1: gather<std::uint8_t><<<blocks, threads, 0, stream>>>(d, s, p); break;
    case 2: gather<std::uint16_t><<<blocks, threads, 0, stream>>>(d, s, p); break;
    case 4: gather<std::uint32_t><<<blocks, threads, 0, stream>>>(d, s, p); break;
    case 8: gather<std::uint64_t><<<blocks, threads, 0, stream>>>(d, s, p); break;
    case 16: gather<word16><<<blocks, threads, 0, stream>>>(d, s, p); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace dlasync::copy_kernels
