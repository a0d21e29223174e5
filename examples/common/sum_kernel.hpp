// The CUDA reduction behind device_sum on real GPUs (built with nvcc).
#pragma once

#include <cstdint>

namespace dlasync::examples {

// Enqueues on `stream` (of GPU `device`) a kernel that writes the sum of
// `count` elements of type `code`/`bits` at `data` (device memory) to `*out`
// (page-locked host memory). The calling thread's current device is the
// same afterwards. Returns the cudaError_t of the launch.
int launch_sum_kernel(int device, const void* data, std::uint8_t code, std::uint8_t bits,
                      std::int64_t count, double* out, void* stream);

}  // namespace dlasync::examples
