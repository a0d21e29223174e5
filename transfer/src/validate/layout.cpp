#include "transfer/src/validate/layout.hpp"

#include <algorithm>

namespace dlasync::detail {

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
