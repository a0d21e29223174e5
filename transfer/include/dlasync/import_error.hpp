// dlasync/import_error.hpp
//
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
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"

namespace dlasync {

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

}  // namespace dlasync
