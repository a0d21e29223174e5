#include "transfer/src/copy/gather.hpp"

#if defined(DLASYNC_HAS_CUDA)
#include "transfer/src/copy/gather_kernel.hpp"
#endif

namespace dlasync::detail {
namespace {

class gather_kernel final : public cuda::device_kernel {
 public:
  gather_kernel(void* dst, const void* src, const strided_layout& layout)
      : dst_(dst), src_(src), layout_(layout), bytes_(layout.element_size) {
    for (std::int64_t e : layout.shape) bytes_ *= static_cast<std::uint64_t>(e);
  }

  const char* name() const noexcept override { return "dlasyncGatherKernel"; }
  void* output() const noexcept override { return dst_; }
  std::uint64_t output_bytes() const noexcept override { return bytes_; }

  cuda::error launch(cuda::stream_t stream) const override {
#if defined(DLASYNC_HAS_CUDA)
    copy_kernels::gather_params p;
    if (layout_.shape.size() > static_cast<std::size_t>(max_ndim)) {
      return cuda::error::invalid_value;
    }
    p.ndim = static_cast<int>(layout_.shape.size());
    p.count = 1;
    for (int d = 0; d < p.ndim; ++d) {
      p.shape[d] = layout_.shape[d];
      p.strides[d] = layout_.strides[d];
      p.count *= layout_.shape[d];
    }
    return static_cast<cuda::error>(copy_kernels::launch_gather_kernel(
        dst_, src_, p, static_cast<int>(layout_.element_size), static_cast<cudaStream_t>(stream)));
#else
    (void)stream;
    return cuda::error::initialization_error;  // no real CUDA in this build
#endif
  }

  void simulate() const override {
    const strided_copy copy(layout_);
    copy.run(src_, dst_, 0, copy.units());
  }

 private:
  void* dst_;
  const void* src_;
  strided_layout layout_;
  std::uint64_t bytes_;
};

}  // namespace

cuda::error launch_gather(cuda::api& api, void* dst, const void* src, const strided_layout& layout,
                          cuda::stream_t stream) {
  return api.launch_kernel(std::make_shared<const gather_kernel>(dst, src, layout), stream);
}

}  // namespace dlasync::detail
