// The compaction kernel's launcher, built by nvcc (gather_kernel.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dlasync::cuda::detail {

inline constexpr int max_gather_dims = 64;

// Passed by value to the kernel: the source layout, strides in elements.
struct gather_params {
  std::int64_t count = 0;
  int ndim = 0;
  std::int64_t shape[max_gather_dims] = {};
  std::int64_t strides[max_gather_dims] = {};
};

cudaError_t launch_gather_kernel(void* dst, const void* src, const gather_params& p,
                                 int element_size, cudaStream_t stream);

}  // namespace dlasync::cuda::detail
