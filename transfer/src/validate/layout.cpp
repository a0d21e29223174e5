#include "transfer/src/validate/layout.hpp"

#include <algorithm>
#include <limits>

namespace dlasync::detail {

void row_major_strides(std::span<const std::int64_t> shape, std::span<std::int64_t> strides) {
  std::int64_t stride = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    if (__builtin_mul_overflow(stride, std::max<std::int64_t>(shape[i], 1), &stride)) {
      stride = std::numeric_limits<std::int64_t>::max();
    }
  }
}

device memory_space(device d) {
  if (is_host_memory(d.kind)) return d.kind == device_kind::cpu ? d : host_device;
  if (d.kind == device_kind::cuda_managed) return {device_kind::cuda, d.ordinal};
  return d;
}

strided_layout source_layout(const DLTensor& dl, const import_plan& plan) {
  strided_layout layout;
  if (plan.type.is_sub_byte()) {  // packed and compact: plain bytes
    layout.element_size = 1;
    layout.shape.push_back(static_cast<std::int64_t>(plan.byte_size));
    layout.strides.push_back(1);
    return layout;
  }
  layout.element_size = plan.type.bits / 8u;
  layout.shape.assign(dl.shape, dl.shape + dl.ndim);
  layout.strides.resize(layout.shape.size());
  if (dl.strides != nullptr) {
    std::copy_n(dl.strides, dl.ndim, layout.strides.begin());
  } else {
    row_major_strides(layout.shape, layout.strides);
  }
  return layout;
}

}  // namespace dlasync::detail
