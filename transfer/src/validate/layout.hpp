// Layout helpers (internal), one copy of each: what validation decides
// about memory spaces and what copies need to know about a tensor's
// layout.
#pragma once

#include <cstdint>
#include <span>

#include "dlasync/runtime/device.hpp"
#include "dlasync/transfer/dlpack.hpp"
#include "dlasync/transfer/validate.hpp"
#include "transfer/src/copy/strided_copy.hpp"

namespace dlasync::detail {

// Writes the row-major strides (in elements) of `shape` into `strides`, of
// the same length. Validation bounds their product for tensors with
// elements; a size-0 tensor may have huge other extents and addresses
// nothing, so its strides saturate at INT64_MAX instead of overflowing.
void row_major_strides(std::span<const std::int64_t> shape, std::span<std::int64_t> strides);

// The memory a device names: pinned host memory is this process's host
// memory (cpu:0); managed memory of GPU n is read in place on cuda:n;
// virtual host devices are distinct. Two devices of one memory space need
// no copy between them.
device memory_space(device d);

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
