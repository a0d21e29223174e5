// The copy engine's entry (internal): runs a copy on the path its transfer
// plan chose (transfer/src/plan/transfer_plan.hpp lists the paths and
// where each is carried out).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "dlasync/device.hpp"
#include "dlasync/dlpack_stream.hpp"
#include "runtime/src/backend.hpp"
#include "runtime/src/completion_marker.hpp"
#include "runtime/src/runtime_counters.hpp"
#include "transfer/src/copy/copy_services.hpp"
#include "transfer/src/layout/strided_layout.hpp"
#include "transfer/src/plan/transfer_plan.hpp"

namespace dlasync::detail {

// The byte counter of runtime::stats that a copy on `path` adds to;
// nothing for the views, which move no bytes.
std::optional<byte_path> counted_path(transfer_path path) noexcept;

// Lets an import stop a copy that has not finished. The copy checks
// `cancel_requested` between pieces and sets `aborted` when it stopped early
// (the destination is then incomplete).
struct copy_control {
  std::atomic<bool> cancel_requested{false};
  std::atomic<bool> aborted{false};
  // Tags the device work enqueued for this copy (cuda::owner_scope).
  const std::uint64_t owner = next_owner();

  static std::uint64_t next_owner() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
};

// One copy on its path: what it reads and writes.
struct copy_request {
  transfer_path path = transfer_path::host_to_host;
  device source;  // the source's device as the tensor names it
  device target;
  const void* from = nullptr;  // the source's first element
  void* to = nullptr;          // the compact destination of `bytes`
  strided_layout layout;       // how `from` is read (the plan's, simplified)
  std::uint64_t bytes = 0;
  bool compact = false;  // row-major: the source is `bytes` in a row
  // The point of the producer's stream the reads must follow, recorded when
  // the import was called; null when there is none.
  marker_ptr produced;
  std::shared_ptr<copy_control> control;
};

// Starts `request` on stream `s` of the plan's stream device. The
// marker completes, with the copy's status, once the copy has finished
// reading the source and writing the destination; after a failure or a
// cancellation, only once nothing enqueued for it can touch them any more.
marker_ptr start_copy(const copy_services& with, stream_slot s, copy_request request);

}  // namespace dlasync::detail
