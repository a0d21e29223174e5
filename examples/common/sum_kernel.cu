#include <cuda_runtime.h>

#include "sum_kernel.hpp"

namespace dlasync::examples {
namespace {

// One block: request-sized tensors do not need a grid, and one block keeps
// the sum's order, and so its rounding, the same from run to run.
constexpr int threads = 512;

template <typename T>
__global__ void sum_kernel(const T* data, long long count, double* out) {
  __shared__ double partial[threads];
  double acc = 0;
  for (long long i = threadIdx.x; i < count; i += threads) acc += static_cast<double>(data[i]);
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int width = threads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = partial[0];
}

// cudaLaunchKernelEx returns the launch's own status: `<<<>>>` followed by
// cudaGetLastError would report any earlier failed call of this thread as
// the kernel's.
template <typename T>
int launch(const void* data, long long count, double* out, void* stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(threads);
  config.stream = static_cast<cudaStream_t>(stream);
  return static_cast<int>(
      cudaLaunchKernelEx(&config, sum_kernel<T>, static_cast<const T*>(data), count, out));
}

int launch_typed(const void* data, std::uint8_t code, std::uint8_t bits, std::int64_t count,
                 double* out, void* stream) {
  if (code == 2 && bits == 32) return launch<float>(data, count, out, stream);
  if (code == 2 && bits == 64) return launch<double>(data, count, out, stream);
  if (code == 0 && bits == 32) return launch<int>(data, count, out, stream);
  if (code == 0 && bits == 64) return launch<long long>(data, count, out, stream);
  if (code == 1 && bits == 8) return launch<unsigned char>(data, count, out, stream);
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace

int launch_sum_kernel(int device, const void* data, std::uint8_t code, std::uint8_t bits,
                      std::int64_t count, double* out, void* stream) {
  int previous = 0;
  if (cudaError_t e = cudaGetDevice(&previous); e != cudaSuccess) return static_cast<int>(e);
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return static_cast<int>(e);
  const int launched = launch_typed(data, code, bits, count, out, stream);
  cudaSetDevice(previous);
  return launched;
}

}  // namespace dlasync::examples
