// dlasync/validate.hpp
//
// Up-front validation, and what an import's errors say. `plan_import`
// decides, before anything is consumed or scheduled, whether a DLPack
// tensor can be imported as `import_options` asks, and what the import must
// do (view or copy, and why). It reads the tensor's description (version,
// flags, device, ndim, dtype, shape, strides, byte offset, the data
// pointer's value) and never the tensor's data, and takes nothing: on error
// the caller still owns the tensor. Every refusal, and every failure of an
// import (dlasync/import.hpp), carries an `import_error`.
//
// Example:
//
//   absl::StatusOr<dlasync::import_plan> plan =
//       dlasync::plan_import(tensor, options, rt.registry());
//   if (!plan.ok()) return plan.status();  // tensor untouched
//   if (plan->needs_copy()) ...             // plan->copy_reason_text() says why
//
// Thread safety: pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlasync/device_registry.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/dtype.hpp"
#include "dlasync/import_options.hpp"

namespace dlasync {

// What an import's error says beyond its code and message, for programs:
// whether the tensor was consumed, which rule refused it, and why a copy
// was needed. It travels as an absl::Status payload (abseil's way to attach
// structured detail to a status) under `import_error_url`, so it survives
// copying and returning the status.
//
// Example:
//
//   absl::StatusOr<dlasync::tensor> t = co_await dlasync::import_dlpack(rt, source);
//   if (!t.ok()) {
//     std::optional<dlasync::import_error> why = dlasync::import_error_of(t.status());
//     if (why && !why->consumed) hand_back(std::move(source));  // still ours
//     if (why && why->rule == "copy") retry_with_copy();         // copy=false refused
//   }
//
// Every status an import, a batch member or import_view returns carries it,
// except OK. The rules (`rule`): "options", "version", "shape", "dtype",
// "byte_size", "source_device", "target_device", "stream",
// "consumer_stream", "strides", "address", "copy" (copy=false and a copy is
// needed; also import_view when a copy would be), "placement" (the target
// cannot hold copies), "location" (the memory is not where the tensor says,
// or its location cannot be asked), "staging" (a row larger than a staging
// chunk), "budget" (larger than the whole copy budget), "shutdown",
// "producer_stream" (the producer's stream cannot be followed), and ""
// for the failures of a copy under way (memory, a CUDA error, cancellation).

struct import_error {
  // True when the import had taken the tensor (its deleter has run or runs
  // with the import's end); false when the caller's handle still holds it.
  bool consumed = false;
  // The rule that refused it (see above); empty for a failure in flight.
  std::string rule;
  // Why a copy was needed, as comma-separated names of copy_reason
  // ("cross_device,alignment"); empty when no copy was planned or known.
  std::string copy_reasons;
};

inline constexpr char import_error_url[] = "type.dlasync.dev/dlasync.import_error";

// The facts `status` carries; empty for OK and for statuses not made by an
// import.
std::optional<import_error> import_error_of(const absl::Status& status);

// `status` with `error` attached (replacing any earlier one).
absl::Status with_import_error(absl::Status status, const import_error& error);

// Up-front validation: `plan_import` decides, before anything is consumed or
// scheduled, whether a DLPack tensor can be imported as `import_options`
// asks, and what the import must do (view or copy, and why). It reads the
// tensor's description (version, flags, device, ndim, dtype, shape, strides,
// byte offset, the data pointer's value) and never the tensor's data. It
// takes nothing: on error the caller still owns the tensor.
//
// Example:
//
//   absl::StatusOr<dlasync::import_plan> plan =
//       dlasync::plan_import(tensor, options, registry);
//   if (!plan.ok()) return plan.status();  // tensor untouched
//   if (plan->needs_copy()) ...             // plan->copy_reason_text() says why
//
// Status codes (docs/foundation.md lists every rule and message):
//   InvalidArgument    malformed tensor or options (NULL pointers, negative
//                      ndim or extents, bits not valid for the type, bad stream);
//   OutOfRange         sizes beyond limits: ndim above max_ndim, element count,
//                      byte size or address span overflowing 64 bits;
//   Unimplemented      legal DLPack that dlasync does not import: newer major
//                      version, vector lanes, opaque handles, padded sub-byte
//                      types, device kinds no backend of this build serves;
//   FailedPrecondition a device of another process, or copy=false while a
//                      copy is needed;
//   NotFound           a device ordinal that does not exist in this process.
//
// Thread safety: a pure function; safe from any thread.

// Why an import must copy; a plan holds a set of these as bits.
enum class copy_reason : std::uint8_t {
  requested = 1,     // copy=true and the producer did not copy already
  cross_device = 2,  // the target is another memory space than the source
  alignment = 4,     // the first element is less aligned than required
  contiguity = 8,    // require_contiguous and the strides are not row-major
  writable = 16,     // require_writable and the source is read-only
  // The target is page-locked host memory (cuda_host) and the source is
  // labelled pageable host memory (cpu): DLPack's kDLCUDAHost promises
  // locked pages, which a relabelled view could not keep.
  page_locked = 32,
};

struct import_plan {
  device source;
  device target;
  dtype type;
  std::int32_t ndim = 0;
  std::int64_t element_count = 0;
  // Bytes of the elements stored compactly (packed for sub-byte types).
  std::uint64_t byte_size = 0;
  // The bytes the strides reach, relative to the first element's address:
  // [span_begin, span_end); both 0 for a size-0 tensor.
  std::int64_t span_begin = 0;
  std::int64_t span_end = 0;
  bool compact = false;    // row-major (extents of 1 may have any stride)
  bool read_only = false;  // READ_ONLY, or zero or negative strides
  bool versioned = false;
  std::uint64_t flags = 0;     // the known versioned flags
  std::size_t alignment = 1;   // what the target requires of the first element
  std::uintptr_t address = 0;  // the first element's address (data + byte_offset)
  // The producer's stream the import must follow (DLPack encoding), or
  // stream_no_sync.
  std::int64_t producer_stream = stream_no_sync;
  // The caller's stream that is to wait for the import on the device, or
  // stream_no_sync.
  std::int64_t consumer_stream = stream_no_sync;
  std::uint8_t copy_reasons = 0;

  bool needs_copy() const noexcept { return copy_reasons != 0; }
  // A view that must wait for the producer's stream before it is handed out.
  bool needs_wait() const noexcept { return producer_stream != stream_no_sync; }
  bool has(copy_reason r) const noexcept {
    return (copy_reasons & static_cast<std::uint8_t>(r)) != 0;
  }
  // "cross-device (cpu:0 to cpu:1), alignment (...)", or "none".
  std::string copy_reason_text() const;
  // "cross_device,alignment": the reasons' names, for import_error.
  std::string copy_reason_names() const;
};

// Validates `tensor` against `options` and the devices of `registry`, and
// plans the import. See the file comment for the codes.
absl::StatusOr<import_plan> plan_import(const managed_tensor& tensor, const import_options& options,
                                        const device_registry& registry);

// The same checks, when only the verdict is wanted.
absl::Status validate_dlpack(const managed_tensor& tensor, const import_options& options,
                             const device_registry& registry);

}  // namespace dlasync
