#include "transfer/src/copy/gather.hpp"

#include <algorithm>
#include <cstring>

#include "transfer/src/copy/gather_math.hpp"
#if defined(DLASYNC_HAS_CUDA)
#include "transfer/src/copy/gather_kernel.hpp"
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

}  // namespace

cuda::error run_gather_grid(const copy_kernels::gather_params& params, const void* src_base,
                            void* dst_base) {
  using namespace copy_kernels;
  const gather_launch g = gather_geometry(params.count);
  const std::int64_t stride = gather_word_stride(g);
  const auto word = static_cast<std::size_t>(params.word_bytes);
  const auto* src = static_cast<const char*>(src_base);
  auto* dst = static_cast<char*>(dst_base);
  for (int block = 0; block < g.blocks; ++block) {
    for (int thread = 0; thread < g.threads; ++thread) {
      for (std::int64_t i = gather_first_word(g, block, thread); i < params.count; i += stride) {
        const char* load = src + gather_source_offset(i, params);
        char* store = dst + i * params.word_bytes;
        if (reinterpret_cast<std::uintptr_t>(load) % word != 0 ||
            reinterpret_cast<std::uintptr_t>(store) % word != 0) {
          return cuda::error::misaligned_address;
        }
        std::memcpy(store, load, word);
      }
    }
  }
  return cuda::error::success;
}

absl::StatusOr<copy_kernels::gather_params> gather_params_for(void* dst, const void* src,
                                                              const strided_layout& layout) {
  copy_kernels::gather_params p;
  if (layout.shape.size() > static_cast<std::size_t>(max_ndim)) {
    return absl::InvalidArgumentError("the gather kernel takes at most max_ndim dimensions");
  }
  p.ndim = static_cast<int>(layout.shape.size());
  p.element_bytes = static_cast<std::int64_t>(layout.element_size);
  p.word_bytes =
      copy_kernels::gather_word_bytes(reinterpret_cast<std::uintptr_t>(src),
                                      reinterpret_cast<std::uintptr_t>(dst), p.element_bytes);
  p.words_per_element = static_cast<int>(p.element_bytes / p.word_bytes);
  std::int64_t elements = 1;
  for (int d = 0; d < p.ndim; ++d) {
    p.shape[d] = layout.shape[static_cast<std::size_t>(d)];
    p.strides[d] = layout.strides[static_cast<std::size_t>(d)];
    elements *= p.shape[d];
  }
  p.count = elements * p.words_per_element;
  return p;
}

cuda::memory_range source_extent(const void* src, const strided_layout& layout) {
  // An empty tensor reaches nothing, whatever its other extents and strides
  // (which validation does not bound then); a non-empty one's span was
  // checked for overflow by validation.
  for (const std::int64_t e : layout.shape) {
    if (e == 0) return {src, 0};
  }
  std::int64_t low = 0;
  std::int64_t high = 0;
  for (std::size_t d = 0; d < layout.shape.size(); ++d) {
    const std::int64_t reach = (layout.shape[d] - 1) * layout.strides[d];
    (reach < 0 ? low : high) += reach;
  }
  const auto element = static_cast<std::int64_t>(layout.element_size);
  return {static_cast<const char*>(src) + low * element,
          static_cast<std::uint64_t>((high - low) * element + element)};
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
