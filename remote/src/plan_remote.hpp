// Validation of a remote descriptor (internal): the checks of a local
// import, before any byte moves.
//
// `plan_remote` describes the remote tensor to plan_import as a tensor of
// this process's host memory at the exporter's address (validation never
// reads data, so the address is only a number), which checks version,
// dtype, shape, strides, byte offset, alignment and every overflow exactly
// as for a local tensor, against the caller's options. It then adds what
// only a remote tensor has: the exporter's device must be host memory, the
// bytes the strides reach must lie inside the registered region, the
// region must come with a remote key, copy=false and producer streams are
// refused. Every refusal carries an import_error (consumed = false).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "dlasync/remote/descriptor.hpp"
#include "dlasync/runtime/device_registry.hpp"
#include "dlasync/transfer/import_options.hpp"
#include "dlasync/transfer/validate.hpp"

namespace dlasync::remote_detail {

struct remote_plan {
  // plan_import's verdict; `target` is where the tensor lands, `address`
  // the first element's address in the exporter's process.
  import_plan plan;
  // The bytes the strides reach, in the exporter's address space.
  std::uint64_t span_begin = 0;
  std::uint64_t span_bytes = 0;
};

// The innermost contiguous run of a row-major walk over `shape` with
// `strides` (elements of `elem` bytes): how many dimensions it covers, from
// the last, and its length in bytes.
struct run_shape {
  std::size_t inner_dims = 0;
  std::uint64_t bytes = 0;
};
run_shape contiguous_run(const std::vector<std::int64_t>& shape,
                         const std::vector<std::int64_t>& strides, std::uint64_t elem);

absl::StatusOr<remote_plan> plan_remote(const remote_descriptor& d, const import_options& options,
                                        const device_registry& registry);

}  // namespace dlasync::remote_detail
