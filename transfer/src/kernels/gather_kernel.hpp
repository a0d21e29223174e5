// The compaction kernel's launcher (internal), built by nvcc
// (gather_kernel.cu). Plain C++17 for nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include "transfer/src/kernels/gather_math.hpp"

namespace dlasync::copy_kernels {

// Launches the gather of the `p.count` words `p` describes from `src` (the
// first element) into the compact `dst`, on `stream` of the current device,
// and returns the launch's own status (cudaLaunchKernelEx): never the
// error of an earlier call on this thread.
cudaError_t launch_gather_kernel(void* dst, const void* src, const gather_params& p,
                                 cudaStream_t stream);

}  // namespace dlasync::copy_kernels
