// The gather as a kernel of the CUDA seam (internal): compacts a strided
// tensor on a GPU into row-major order on the same GPU. On a real GPU it
// launches the nvcc-built kernel (gather_kernel.cu); on a simulated one the
// host copy kernel does the same work in stream order.
#pragma once

#include <memory>

#include "runtime/src/cuda/cuda_api.hpp"
#include "transfer/src/copy/strided_copy.hpp"

namespace dlasync::detail {

// Launches the gather of the strided tensor at `src` (its first element)
// into the compact `dst` (`layout`'s bytes, on the same GPU as `src`) on
// `stream` of the current device.
cuda::error launch_gather(cuda::api& api, void* dst, const void* src, const strided_layout& layout,
                          cuda::stream_t stream);

}  // namespace dlasync::detail
