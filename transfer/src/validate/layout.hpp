// Validation's helpers (internal): planning into an import's own start,
// and what validation decides about memory spaces and first elements. The
// small ones are inline: the zero-copy fast path calls them. The layout
// arithmetic lives on the layout floor (transfer/src/layout/).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "dlasync/device.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/validate.hpp"

namespace dlasync::detail {

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

}  // namespace dlasync::detail
