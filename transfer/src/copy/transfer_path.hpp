// Transfer paths (internal): the one decision that picks how an import
// moves its bytes, made once from the import plan, and the entry that runs
// a copy on its path.
//
//   path                 from            to     how (file)
//   view                 anywhere        same   no work: the producer's memory as it is
//   view_after_producer  GPU, pinned     same   the view once the producer's stream got there
//   host_to_host         host            cpu:N  strided copy on the workers (host_copy.cpp)
//   pinned_to_gpu        compact pinned  GPU    one cudaMemcpyAsync (device_copy.cpp)
//   pageable_to_gpu      other host      GPU    gathered into pinned chunks, uploaded
//                                               (device_copy.cpp, staging_pipeline.cpp)
//   gpu_to_host          GPU, managed    cpu:N  compacted on the GPU when strided, then
//                                               downloaded through pinned chunks
//   within_gpu           GPU, managed    same   cudaMemcpyAsync, or the gather kernel
//                        GPU                    when strided (device_copy.cpp, gather.cpp)
//   gpu_to_gpu           GPU, managed    peer   compacted on the source GPU when strided,
//                                               then copied across (device_copy.cpp)
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "dlasync/runtime/device.hpp"
#include "dlasync/runtime/dlpack_stream.hpp"
#include "dlasync/transfer/validate.hpp"
#include "runtime/src/backend.hpp"
#include "runtime/src/completion_marker.hpp"
#include "runtime/src/runtime_core.hpp"
#include "runtime/src/runtime_counters.hpp"
#include "transfer/src/copy/strided_copy.hpp"

namespace dlasync::detail {

enum class transfer_path : std::uint8_t {
  view,
  view_after_producer,
  host_to_host,
  pinned_to_gpu,
  pageable_to_gpu,
  gpu_to_host,
  within_gpu,
  gpu_to_gpu,
};

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
  strided_layout layout;       // how `from` is read
  std::uint64_t bytes = 0;
  bool compact = false;  // row-major: the source is `bytes` in a row
  // The point of the producer's stream the reads must follow, recorded when
  // the import was called; null when there is none.
  marker_ptr produced;
  std::shared_ptr<copy_control> control;
};

// The path of an import that `plan` (from plan_import) describes, on the
// runtime of `core`. Where a backend can tell, it checks that GPU memory
// lies where the tensor says (FailedPrecondition naming both devices when
// not), and learns whether a host source bound for a GPU is page-locked; a
// failed pointer query is the error. Nothing is consumed either way.
absl::StatusOr<transfer_path> choose_path(runtime_core& core, const import_plan& plan);

// The GPU whose streams the special producer stream values (1, 2) name:
// the source's GPU, else the target GPU, else GPU 0 (pinned memory copied
// to the host: DLPack's kDLCUDAHost names no GPU).
int producer_gpu(const import_plan& plan) noexcept;

// The device whose streams carry `path`'s work: the source GPU for
// downloads, else the target.
device stream_device(transfer_path path, const import_plan& plan) noexcept;

// Starts `request` on stream `s` of stream_device(request.path, ...). The
// marker completes, with the copy's status, once the copy has finished
// reading the source and writing the destination; after a failure or a
// cancellation, only once nothing enqueued for it can touch them any more.
marker_ptr start_copy(runtime_core& core, stream_ref s, copy_request request);

}  // namespace dlasync::detail
