// An import's start (internal): what validation and the transfer plan
// decided before the import took its source, and what it took.
#pragma once

#include <chrono>
#include <memory>
#include <optional>

#include "dlasync/detail/import_initiation.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/import.hpp"
#include "runtime/src/completion_marker.hpp"
#include "transfer/src/plan/transfer_plan.hpp"

namespace dlasync::detail {

// A result already (an error, which leaves the caller's handle untouched,
// or a zero-copy view), or a consumed source with its plans.
struct import_start {
  std::optional<import_result> ready;
  managed_tensor source;
  import_plan plan;
  transfer_plan transfer;
  // The point the producer's stream had reached at the start, recorded on
  // the starting thread (stream 2 is that thread's own); null without one.
  marker_ptr produced;
  // The copy budget for transfer.hold_bytes is held already (a batch
  // reserves its members' budget together).
  bool budget_held = false;
  // When the import's copy or wait began, for its completion latency
  // (runtime::stats); time_point{} until it copies or waits.
  std::chrono::steady_clock::time_point began;
};

// Validates `source` and plans its transfer; consumes nothing. The result
// is ready with the error when that fails.
import_start prepare_import(runtime& rt, managed_tensor& source, const import_options& options);

// Takes `source` for a prepared import that is not ready: a view is made at
// once; a producer's stream is recorded first (its failure is the result,
// and `source` keeps the tensor).
void take_source(runtime& rt, import_start& start, managed_tensor& source);

// A small host-to-host copy of a started import, done here on the calling
// thread (runtime_options::inline_copy_bytes). Nothing when the import does
// not qualify or cannot start at once (the budget has waiters, memory is
// short): it then takes the asynchronous path, which waits or reports.
std::optional<import_result> copy_inline(runtime& rt, import_start& start);

}  // namespace dlasync::detail
