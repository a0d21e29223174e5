// The gather as a kernel of the CUDA seam (internal): compacts a strided
// tensor on a GPU into row-major order on the same GPU. On a real GPU it
// launches the nvcc-built kernel (gather_kernel.cu); on a simulated one the
// same grid, index math (gather_math.hpp), loads and stores run on the
// host in stream order.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/src/cuda/cuda_api.hpp"
#include "transfer/src/kernels/gather_math.hpp"
#include "transfer/src/kernels/strided_copy.hpp"

namespace dlasync::detail {

// The kernel's parameters for gathering `layout` from `src` (its first
// element) into `dst`: the layout simplified (extents of 1 dropped,
// contiguous dimensions merged), the word size from the addresses'
// alignment, the tiled transpose or the plain gather
// (copy_kernels::gather_tile_dim), and the divisors' magic numbers.
// InvalidArgument beyond max_ndim dimensions.
absl::StatusOr<copy_kernels::gather_params> gather_params_for(void* dst, const void* src,
                                                              const strided_layout& layout);

// Fills in what `p`'s count, ndim, shape, words_per_element and tile_dim
// imply: the magic numbers of its divisors, and the tiles' destination
// strides and count. gather_params_for does it; tests that build
// parameters by hand call it.
void prepare_divisors(copy_kernels::gather_params& p);

// The bytes a strided tensor at `src` (its first element) spans, negative
// strides included: what the gather reads.
cuda::memory_range source_extent(const void* src, const strided_layout& layout);

// Runs the kernel's grid on the host, thread by thread, with the GPU's
// index math, loads and stores: what a simulated GPU runs (the tiled
// kernel block by block, each tile's loads into a shared tile before its
// stores). Returns misaligned_address, having stopped, at the first load
// or store not aligned to its word (a GPU would fault there);
// illegal_address or launch_failure where the tiles' index math would
// leave the shared tile or the destination, or race in it.
cuda::error run_gather_grid(const copy_kernels::gather_params& params, const void* src, void* dst);

// Launches the gather of the strided tensor at `src` (its first element)
// into the compact `dst` (`layout`'s bytes, on the same GPU as `src`) on
// `stream` of the current device.
cuda::error launch_gather(cuda::api& api, void* dst, const void* src, const strided_layout& layout,
                          cuda::stream_t stream,
                          cuda::api::site where = cuda::api::site::current());

}  // namespace dlasync::detail
