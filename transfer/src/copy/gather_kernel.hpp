// The compaction kernel's launcher (internal), built by nvcc
// (gather_kernel.cu). Plain C++17 for nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "dlasync/transfer/limits.hpp"

namespace dlasync::copy_kernels {

// Passed by value to the kernel: the source layout, strides in elements.
struct gather_params {
  std::int64_t count = 0;
  int ndim = 0;
  std::int64_t shape[max_ndim] = {};
  std::int64_t strides[max_ndim] = {};
};

// Launches the gather of `p.count` elements of `element_size` bytes (1, 2,
// 4, 8 or 16) from `src` (the first element) into the compact `dst`, on
// `stream` of the current device.
cudaError_t launch_gather_kernel(void* dst, const void* src, const gather_params& p,
                                 int element_size, cudaStream_t stream);

}  // namespace dlasync::copy_kernels
