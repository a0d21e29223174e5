// dlasync/transfer/detail/import_op.hpp
//
// The machinery behind dlasync/transfer/import.hpp: validation up front, the
// copy operation driven through the backend seam, batches, and the glue that
// delivers a result to an Asio completion handler.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "asio/associated_cancellation_slot.hpp"
#include "asio/associated_executor.hpp"
#include "asio/cancellation_type.hpp"
#include "asio/execution/outstanding_work.hpp"
#include "asio/post.hpp"
#include "asio/prefer.hpp"
#include "asio/use_awaitable.hpp"
#include "dlasync/runtime/runtime.hpp"
#include "dlasync/transfer/import_options.hpp"
#include "dlasync/transfer/managed_tensor.hpp"
#include "dlasync/transfer/tensor.hpp"
#include "dlasync/transfer/validate.hpp"

namespace dlasync::detail {

using import_result = absl::StatusOr<tensor>;
using batch_result = std::vector<import_result>;

// What validation decided: a result already (an error, which leaves the
// caller's handle untouched, or a zero-copy view), or a consumed source and
// the plan for copying it.
struct import_start {
  std::optional<import_result> ready;
  managed_tensor source;
  import_plan plan;
};

// Validates `source` against `options` and takes it only when that passes.
import_start begin_import(runtime& rt, managed_tensor& source, const import_options& options);

// A small host-to-host copy of a consumed `source`, done here on the
// calling thread: it takes less time than the hop to a worker and back
// (runtime_options::inline_copy_bytes). Nothing when the import does not
// qualify or cannot start at once (the budget has waiters, memory is
// short): it then takes the asynchronous path, which waits or reports.
std::optional<import_result> copy_inline(runtime& rt, managed_tensor& source,
                                         const import_plan& plan);

// begin_import for each of `sources`.
std::vector<import_start> begin_batch(runtime& rt, std::span<managed_tensor> sources,
                                      const import_options& options);

// One copy import: budget, allocation, the copy on a stream of the target,
// the release of the source once the copy has read it, the result.
class copy_import : public std::enable_shared_from_this<copy_import> {
 public:
  using done_fn = absl::AnyInvocable<void(import_result) &&>;

  copy_import(runtime& rt, managed_tensor source, const import_plan& plan, done_fn done);

  // Starts the work; `done` then runs exactly once, on a worker thread or,
  // when the start itself fails, on this one.
  void start();

  // Stops the import if it has not finished; any thread, any number of times.
  void cancel();

 private:
  void on_budget(absl::Status status);
  void enqueue(stream_ref stream, copy_job job);
  void on_copied(absl::Status status);
  void finish(import_result result);

  runtime& rt_;
  managed_tensor source_;
  import_plan plan_;
  done_fn done_;
  absl::InlinedVector<std::int64_t, 8> shape_;
  std::shared_ptr<copy_control> control_;
  std::mutex mutex_;
  std::uint64_t ticket_ = 0;
  bool waiting_for_budget_ = false;
  std::uint64_t op_id_ = 0;
  device_buffer buffer_;
};

// A batch: each member validated and started on its own; `done` runs once
// when all have finished, with one result per member in order.
class batch_import : public std::enable_shared_from_this<batch_import> {
 public:
  using done_fn = absl::AnyInvocable<void(batch_result) &&>;

  batch_import(std::size_t size, done_fn done);

  void start(runtime& rt, std::vector<import_start> members);
  void cancel();

 private:
  void member_done(std::size_t index, import_result result);
  void arrive();

  batch_result results_;
  std::atomic<std::size_t> remaining_{0};
  done_fn done_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<copy_import>> ops_;
  bool cancelled_ = false;
};

// Wraps `handler` so that calling the result posts the handler, with its
// argument, to the handler's associated executor (the runtime's when it has
// none), holding outstanding work on it meanwhile. The handler's
// cancellation slot is cleared there, just before the call.
template <typename Result, typename Handler>
absl::AnyInvocable<void(Result) &&> deliver_to(Handler handler, runtime& rt) {
  auto work = asio::prefer(asio::get_associated_executor(handler, rt.get_executor()),
                           asio::execution::outstanding_work.tracked);
  return [handler = std::move(handler), work = std::move(work)](Result result) mutable {
    auto executor = std::move(work);
    asio::post(executor, [handler = std::move(handler), result = std::move(result)]() mutable {
      asio::get_associated_cancellation_slot(handler).clear();
      std::move(handler)(std::move(result));
    });
  };
}

// Cancels `op` when `slot` (a handler's cancellation slot) is emitted.
template <typename Slot, typename Op>
void assign_cancellation(Slot& slot, const std::shared_ptr<Op>& op) {
  if (!slot.is_connected()) return;
  slot.assign([weak = std::weak_ptr<Op>(op)](asio::cancellation_type type) {
    if (type == asio::cancellation_type::none) return;
    if (std::shared_ptr<Op> locked = weak.lock()) locked->cancel();
  });
}

struct initiate_import {
  runtime* rt;

  template <typename Handler>
  void operator()(Handler&& handler, import_start start) const {
    if (!start.ready) start.ready = copy_inline(*rt, start.source, start.plan);
    if (start.ready) {
      deliver_to<import_result>(std::forward<Handler>(handler), *rt)(std::move(*start.ready));
      return;
    }
    auto h = std::forward<Handler>(handler);
    auto slot = asio::get_associated_cancellation_slot(h);
    auto op = std::make_shared<copy_import>(*rt, std::move(start.source), start.plan,
                                            deliver_to<import_result>(std::move(h), *rt));
    assign_cancellation(slot, op);
    op->start();
  }
};

struct initiate_batch {
  runtime* rt;

  template <typename Handler>
  void operator()(Handler&& handler, std::vector<import_start> members) const {
    auto h = std::forward<Handler>(handler);
    auto slot = asio::get_associated_cancellation_slot(h);
    auto op =
        std::make_shared<batch_import>(members.size(), deliver_to<batch_result>(std::move(h), *rt));
    assign_cancellation(slot, op);
    op->start(*rt, std::move(members));
  }
};

}  // namespace dlasync::detail
