// Layout helpers (internal), one copy of each: what validation decides
// about memory spaces and what copies need to know about a tensor's
// layout. The small ones are inline: the zero-copy fast path calls them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>

#include "absl/status/status.h"
#include "dlasync/runtime/device.hpp"
#include "dlasync/transfer/dlpack.hpp"
#include "dlasync/transfer/validate.hpp"
#include "transfer/src/copy/strided_copy.hpp"

namespace dlasync::detail {

// Writes the row-major strides (in elements) of `shape` into `strides`, of
// the same length. Validation bounds their product for tensors with
// elements; a size-0 tensor may have huge other extents and addresses
// nothing, so its strides saturate at INT64_MAX instead of overflowing.
inline void row_major_strides(std::span<const std::int64_t> shape,
                              std::span<std::int64_t> strides) {
  std::int64_t stride = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    if (__builtin_mul_overflow(stride, std::max<std::int64_t>(shape[i], 1), &stride)) {
      stride = std::numeric_limits<std::int64_t>::max();
    }
  }
}

// plan_import's work, written into `plan` instead of returned: an import
// plans into its own start, without copying a returned plan. On an error,
// `plan` holds what was planned before the rule that refused.
absl::Status plan_import_into(const managed_tensor& tensor, const import_options& options,
                              const device_registry& registry, import_plan& plan);

// The memory a device names: pinned host memory is this process's host
// memory (cpu:0); managed memory of GPU n is read in place on cuda:n;
// virtual host devices are distinct. Two devices of one memory space need
// no copy between them.
inline device memory_space(device d) {
  if (is_host_memory(d.kind)) return d.kind == device_kind::cpu ? d : host_device;
  if (d.kind == device_kind::cuda_managed) return {device_kind::cuda, d.ordinal};
  return d;
}

// The first element of the tensor `plan` describes. Validation works on
// addresses as integers, so that a corrupt byte offset is caught without
// pointer arithmetic out of bounds.
inline const void* first_element(const import_plan& plan) noexcept {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): see above
  return reinterpret_cast<const void*>(plan.address);
}

// How a copy reads the source `dl` that `plan` (from plan_import) accepted:
// packed sub-byte data as plain bytes, else its elements with its strides
// (row-major ones for NULL strides).
strided_layout source_layout(const DLTensor& dl, const import_plan& plan);

}  // namespace dlasync::detail
