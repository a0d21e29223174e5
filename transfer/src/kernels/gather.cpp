#include "transfer/src/kernels/gather.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "transfer/src/kernels/gather_math.hpp"
#if defined(DLASYNC_HAS_CUDA)
#include "transfer/src/kernels/gather_kernel.hpp"
#endif

namespace dlasync::detail {
namespace {

class gather_kernel final : public cuda::device_kernel {
 public:
  gather_kernel(void* dst, const void* src, const copy_kernels::gather_params& params,
                cuda::memory_range extent)
      : dst_(dst), src_(src), params_(params), extent_(extent) {}

  const char* name() const noexcept override { return "dlasyncGatherKernel"; }
  void* output() const noexcept override { return dst_; }
  std::uint64_t output_bytes() const noexcept override {
    return static_cast<std::uint64_t>(params_.count) *
           static_cast<std::uint64_t>(params_.word_bytes);
  }
  std::vector<cuda::memory_range> inputs() const override { return {extent_}; }

  cuda::error launch(cuda::stream_t stream) const override {
#if defined(DLASYNC_HAS_CUDA)
    return static_cast<cuda::error>(
        copy_kernels::launch_gather_kernel(dst_, src_, params_, static_cast<cudaStream_t>(stream)));
#else
    (void)stream;
    return cuda::error::initialization_error;  // no real CUDA in this build
#endif
  }

  // The grid the GPU runs, with the same index math, loads and stores.
  cuda::error simulate() const override {
    return run_gather_grid(params_, src_, dst_);
  }

 private:
  void* dst_;
  const void* src_;
  copy_kernels::gather_params params_;
  cuda::memory_range extent_;
};

// One word from `load` to `store`, as a GPU thread moves it: misaligned
// addresses fault.
cuda::error move_word(const copy_kernels::gather_params& p, void* store, const void* load) {
  const auto word = static_cast<std::uintptr_t>(p.word_bytes);
  if (reinterpret_cast<std::uintptr_t>(load) % word != 0 ||
      reinterpret_cast<std::uintptr_t>(store) % word != 0) {
    return cuda::error::misaligned_address;
  }
  std::memcpy(store, load, static_cast<std::size_t>(p.word_bytes));
  return cuda::error::success;
}

// The tiled kernel's grid, block by block and tile by tile in its two
// phases: every thread loads into the block's shared tile, then (the
// __syncthreads) every thread stores from it. Beyond alignment it checks
// what would go wrong silently on a GPU: a slot outside the tile
// (illegal_address), two loads into one slot or a store from a slot no
// load filled (a race, or stale bytes: launch_failure), a store outside the
// destination (illegal_address).
cuda::error run_tile_grid(const copy_kernels::gather_params& p, const void* src_base,
                          void* dst_base) {
  using namespace copy_kernels;
  const int blocks = gather_tile_blocks(p.tiles);
  const auto* src = static_cast<const char*>(src_base);
  auto* dst = static_cast<char*>(dst_base);
  const auto word = static_cast<std::size_t>(p.word_bytes);
  std::vector<unsigned char> shared(gather_tile_slots * word + 16);
  // The shared tile, aligned as the GPU's is for the word.
  unsigned char* tile =
      shared.data() + (16 - reinterpret_cast<std::uintptr_t>(shared.data()) % 16) % 16;
  std::vector<std::uint8_t> filled(gather_tile_slots);
  for (int block = 0; block < blocks; ++block) {
    for (std::int64_t t = block; t < p.tiles; t += blocks) {
      const gather_tile_origin o = gather_tile_at(t, p);
      std::fill(filled.begin(), filled.end(), std::uint8_t{0});
      for (int y = 0; y < gather_tile_rows; ++y) {
        for (int x = 0; x < gather_tile; ++x) {
          for (int k = 0; k < gather_tile_passes; ++k) {
            const gather_tile_move m = gather_tile_load(o, p, x, y, k);
            if (m.slot < 0) continue;
            if (m.slot >= gather_tile_slots) return cuda::error::illegal_address;
            if (filled[static_cast<std::size_t>(m.slot)]++ != 0) return cuda::error::launch_failure;
            const cuda::error e =
                move_word(p, tile + static_cast<std::size_t>(m.slot) * word, src + m.at);
            if (e != cuda::error::success) return e;
          }
        }
      }
      for (int y = 0; y < gather_tile_rows; ++y) {
        for (int x = 0; x < gather_tile; ++x) {
          for (int k = 0; k < gather_tile_passes; ++k) {
            const gather_tile_move m = gather_tile_store(o, p, x, y, k);
            if (m.slot < 0) continue;
            if (m.slot >= gather_tile_slots) return cuda::error::illegal_address;
            if (filled[static_cast<std::size_t>(m.slot)] != 1) return cuda::error::launch_failure;
            if (m.at < 0 || m.at >= p.count) return cuda::error::illegal_address;
            const cuda::error e = move_word(p, dst + m.at * p.word_bytes,
                                            tile + static_cast<std::size_t>(m.slot) * word);
            if (e != cuda::error::success) return e;
          }
        }
      }
    }
  }
  return cuda::error::success;
}

}  // namespace

cuda::error run_gather_grid(const copy_kernels::gather_params& params, const void* src_base,
                            void* dst_base) {
  using namespace copy_kernels;
  if (params.tile_dim >= 0) return run_tile_grid(params, src_base, dst_base);
  const gather_launch g = gather_geometry(params.count);
  const std::int64_t stride = gather_word_stride(g);
  const auto* src = static_cast<const char*>(src_base);
  auto* dst = static_cast<char*>(dst_base);
  for (int block = 0; block < g.blocks; ++block) {
    for (int thread = 0; thread < g.threads; ++thread) {
      for (std::int64_t i = gather_first_word(g, block, thread); i < params.count; i += stride) {
        const cuda::error e =
            move_word(params, dst + i * params.word_bytes, src + gather_source_offset(i, params));
        if (e != cuda::error::success) return e;
      }
    }
  }
  return cuda::error::success;
}

void prepare_divisors(copy_kernels::gather_params& p) {
  using copy_kernels::make_fast_divisor;
  p.per_element = make_fast_divisor(static_cast<std::uint64_t>(p.words_per_element));
  for (int d = 0; d < p.ndim; ++d) {
    p.divide_by[d] = make_fast_divisor(static_cast<std::uint64_t>(p.shape[d]));
  }
  p.tiles = 0;
  if (p.tile_dim < 0) return;
  const int last = p.ndim - 1;
  std::int64_t stride = 1;
  for (int d = last; d >= 0; --d) {
    p.dst_strides[d] = stride;
    stride *= p.shape[d];
  }
  const std::int64_t tile = copy_kernels::gather_tile;
  const std::int64_t cols = (p.shape[last] + tile - 1) / tile;
  const std::int64_t rows = (p.shape[p.tile_dim] + tile - 1) / tile;
  p.divide_by_tile_cols = make_fast_divisor(static_cast<std::uint64_t>(cols));
  p.divide_by_tile_rows = make_fast_divisor(static_cast<std::uint64_t>(rows));
  p.tiles = p.count / (p.shape[last] * p.shape[p.tile_dim]) * rows * cols;
}

absl::StatusOr<copy_kernels::gather_params> gather_params_for(void* dst, const void* src,
                                                              const strided_layout& layout) {
  copy_kernels::gather_params p;
  if (layout.shape.size() > static_cast<std::size_t>(max_ndim)) {
    return absl::InvalidArgumentError("the gather kernel takes at most max_ndim dimensions");
  }
  p.element_bytes = static_cast<std::int64_t>(layout.element_size);
  p.word_bytes =
      copy_kernels::gather_word_bytes(reinterpret_cast<std::uintptr_t>(src),
                                      reinterpret_cast<std::uintptr_t>(dst), p.element_bytes);
  p.words_per_element = static_cast<int>(p.element_bytes / p.word_bytes);
  // An empty tensor moves nothing, whatever its other extents and strides
  // (which validation does not bound then).
  if (std::find(layout.shape.begin(), layout.shape.end(), 0) != layout.shape.end()) return p;
  // Simplified (the layout floor): fewer divisions, and transposes seen as
  // such whatever their unit dimensions.
  const strided_layout simple = simplify(layout);
  std::int64_t elements = 1;
  p.ndim = static_cast<int>(simple.shape.size());
  for (int d = 0; d < p.ndim; ++d) {
    p.shape[d] = simple.shape[d];
    p.strides[d] = simple.strides[d];
    elements *= simple.shape[d];
  }
  p.count = elements * p.words_per_element;
  p.tile_dim = copy_kernels::gather_tile_dim(p.ndim, p.shape, p.strides, p.words_per_element);
  prepare_divisors(p);
  return p;
}

cuda::memory_range source_extent(const void* src, const strided_layout& layout) {
  const byte_extent e = byte_extent_of(layout);
  return {static_cast<const char*>(src) + e.offset, e.length};
}

cuda::error launch_gather(cuda::api& api, void* dst, const void* src, const strided_layout& layout,
                          cuda::stream_t stream, cuda::api::site where) {
  absl::StatusOr<copy_kernels::gather_params> params = gather_params_for(dst, src, layout);
  if (!params.ok()) return cuda::error::invalid_value;
  return api.launch_kernel(
      std::make_shared<const gather_kernel>(dst, src, *params, source_extent(src, layout)), stream,
      where);
}

}  // namespace dlasync::detail
