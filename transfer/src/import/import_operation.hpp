// One asynchronous import (internal): a consumed source on its transfer
// path. A copy takes copy budget, allocates its destination on a stream of
// the device that carries it, runs the path (transfer/src/copy/), releases
// the source once the copy has read it, and delivers the tensor. A view
// that must follow its producer's stream is handed out once the stream has
// reached the import, or at once when the caller's stream can wait for it
// on the device.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/container/inlined_vector.h"
#include "absl/functional/any_invocable.h"
#include "dlasync/device_buffer.hpp"
#include "runtime/src/budget_wait.hpp"
#include "runtime/src/runtime_core.hpp"
#include "transfer/src/copy/copy_services.hpp"
#include "transfer/src/copy/transfer_path.hpp"
#include "transfer/src/import/import_start.hpp"

namespace dlasync::detail {

class import_operation : public std::enable_shared_from_this<import_operation> {
 public:
  using done_fn = absl::AnyInvocable<void(import_result) &&>;

  import_operation(runtime_core& core, import_start started);

  // Starts the work; `done` then runs exactly once, on a worker, the CUDA
  // reactor, or, when the start itself fails, on this thread.
  void start(done_fn done);

  // Stops the import if it has not finished; any thread, any number of times.
  void cancel();

 private:
  void wait_for_producer();
  // True when the caller's consumer stream now waits for `m` on the device,
  // so that the import may resume before `m` completes.
  bool caller_stream_follows(const marker_ptr& m);
  // Hands the source to the releaser, where its deleter runs: nothing may
  // read it any more.
  void release_source();
  // Runs `fn` when `m` completes, never on the thread that starts the import.
  void after(const marker_ptr& m, completion_marker::callback fn);
  void on_budget(absl::Status status);
  void on_copied(absl::Status status);
  void finish(import_result result);

  runtime_core& core_;
  managed_tensor source_;
  import_plan plan_;
  marker_ptr produced_;  // the producer's point at the call, or null
  transfer_plan transfer_;
  budget_wait budget_wait_;
  done_fn done_;
  absl::InlinedVector<std::int64_t, 8> shape_;
  std::shared_ptr<copy_control> control_;
  std::uint64_t op_id_ = 0;
  bool budget_held_ = false;
  device_buffer buffer_;
  free_stream_cell free_stream_;  // a GPU copy's, else null
  runtime_counters::clock::time_point began_;
};

// `status` as the failure of an import that had taken its tensor.
absl::Status failed_after_taking(absl::Status status, const import_plan& plan);

// The destination of a copy, `memory`, holding `bytes` of `budget` until
// the tensor that owns it lets go: they are released after the memory is
// freed.
device_buffer holding_budget(device_buffer memory, std::uint64_t bytes,
                             std::shared_ptr<memory_budget> budget);

// What the copy engine may use of `core` (transfer/src/copy/copy_services.hpp):
// the import orchestrator lends it, and is the one part of transfer that
// reaches the runtime's core.
copy_services copy_services_of(runtime_core& core) noexcept;

// Hands `source`, consumed and read by nothing any more, to the runtime's
// releaser, which runs its deleter (runtime/src/releaser.hpp): a producer's
// deleter is user code that may block, and on the thread that completes a
// copy (a worker, or the CUDA reactor at shutdown) it would hold up other
// imports.
void release_later(runtime_core& core, managed_tensor source);

// Acquires `bytes` of the copy budget (memory_budget::acquire) for
// `granted`: a grant made at once runs on this thread, inside the call; a
// later one arrives on the thread that released memory (a tensor dropped
// anywhere) and is handed to the workers, so that the next import's
// allocation and enqueue never run there. Returns the ticket.
std::uint64_t acquire_budget(runtime_core& core, std::uint64_t bytes,
                             memory_budget::grant_fn granted);

// Counts, for runtime::stats, an import begun at `began` (import_began
// counted it) that completes now with `result`: a failure, a view, or a copy of
// `bytes` on `path`. Called once per import, just before its result is
// handed on.
void count_completed(runtime_core& core, runtime_counters::clock::time_point began,
                     transfer_path path, std::uint64_t bytes, const import_result& result) noexcept;

// Counts, for runtime::stats, an import that began and completed inside
// one call without copying or waiting: a view or a refusal.
inline void count_instant(runtime_core& core, const import_result& result) noexcept {
  core.counters().import_instant(result.ok() ? import_outcome::view : import_outcome::failed);
}

// The Unavailable of an import that began after shutdown started; the
// tensor is not consumed.
absl::Status shutting_down();

// The Cancelled of an import whose runtime began shutting down after the
// tensor was consumed.
absl::Status shut_down_before_copy();

}  // namespace dlasync::detail
