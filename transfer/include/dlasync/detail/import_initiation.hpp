// dlasync/detail/import_initiation.hpp
//
// Plumbing for the initiating functions of dlasync/import.hpp:
// validation up front, then an operation whose result reaches an Asio
// completion handler. The operations themselves are defined in the
// library (transfer/src/import/). Not for direct use.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "asio/associated_cancellation_slot.hpp"
#include "asio/async_result.hpp"
#include "asio/cancellation_type.hpp"
#include "asio/experimental/deferred.hpp"
#include "dlasync/detail/deliver.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/import_options.hpp"
#include "dlasync/runtime.hpp"
#include "dlasync/tensor.hpp"

namespace dlasync::detail {

using import_result = absl::StatusOr<tensor>;
using batch_result = std::vector<import_result>;

// The start of one import: validated, and then either complete already (a
// refusal, which leaves the caller's handle untouched; a zero-copy view; a
// small host copy done on the calling thread, which takes less time than
// the hop to a worker and back) or an operation, made but not started,
// that holds the consumed source and its plan. The operation's state lives
// in the library (transfer/src/import/).
class import_operation;
struct import_begun {
  std::optional<import_result> ready;
  std::shared_ptr<import_operation> op;  // null when ready
};

// Validates `source` against `options` and takes it only when that passes.
import_begun begin_import(runtime& rt, managed_tensor& source, const import_options& options);

// Starts an operation from begin_import; `done` then runs exactly once, on a
// worker or, when the start itself fails, the thread that starts it
// (runtime/src/handoff.hpp).
void start(const std::shared_ptr<import_operation>& op,
           absl::AnyInvocable<void(import_result) &&> done);
// Stops the import if it has not finished; any thread, any number of times,
// also before it starts.
void cancel(import_operation& op);

// A batch: validated together (nothing is consumed when one member is
// refused for the budget), its copies' budget reserved at once, each member
// then started on its own; `done` runs once when all have finished, with
// one result per member in order.
class batch_operation;
std::shared_ptr<batch_operation> make_batch(runtime& rt);
void start(const std::shared_ptr<batch_operation>& op,
           absl::AnyInvocable<void(batch_result) &&> done, std::span<managed_tensor> sources,
           const import_options& options);
void cancel(batch_operation& op);

// The cancellation types an import honours once started: terminal and
// partial (the source has been consumed, and is released: a partial side
// effect). Total cancellation asks for no side effect at all, which an
// import that consumed its source cannot give: it is not honoured, and the
// import runs to its end.
constexpr asio::cancellation_type honoured_cancellation =
    asio::cancellation_type::terminal | asio::cancellation_type::partial;

// Cancels `op` when `slot` (a handler's cancellation slot) is emitted with
// an honoured type.
template <typename Slot, typename Op>
void assign_cancellation(Slot& slot, const std::shared_ptr<Op>& op) {
  if (!slot.is_connected()) return;
  slot.assign([weak = std::weak_ptr<Op>(op)](asio::cancellation_type type) {
    if ((type & honoured_cancellation) == asio::cancellation_type::none) return;
    if (std::shared_ptr<Op> locked = weak.lock()) cancel(*locked);
  });
}

// The initiation steps every operation shares (imports, batches, remote
// imports): the operation, made but not started and holding nothing of
// the handler, is tied to the handler's cancellation slot, then started
// with a completion that reaches the handler on its executor. The slot is
// assigned first so that it is in place before the operation can complete
// (the handler clears it on its own executor, maybe another thread).
template <typename Result, typename Handler, typename Op, typename... Args>
void launch(Handler&& handler, runtime& rt, const std::shared_ptr<Op>& op, Args&&... args) {
  auto h = std::forward<Handler>(handler);
  auto slot = asio::get_associated_cancellation_slot(h);
  assign_cancellation(slot, op);
  start(op, deliver_to<Result>(std::move(h), rt), std::forward<Args>(args)...);
}

// The initiations: validation and consumption happen here, when the
// operation starts, for every completion token (a deferred operation that
// is never launched leaves the tensor with its owner).
struct initiate_import {
  runtime* rt;

  template <typename Handler>
  void operator()(Handler&& handler, managed_tensor* source, const import_options& options) const {
    import_begun begun = begin_import(*rt, *source, options);
    if (begun.ready) {
      deliver_to<import_result>(std::forward<Handler>(handler), *rt)(std::move(*begun.ready));
      return;
    }
    launch<import_result>(std::forward<Handler>(handler), *rt, begun.op);
  }
};

struct initiate_batch {
  runtime* rt;

  template <typename Handler>
  void operator()(Handler&& handler, std::span<managed_tensor> sources,
                  const import_options& options) const {
    launch<batch_result>(std::forward<Handler>(handler), *rt, make_batch(*rt), sources, options);
  }
};

// The default completion token: the executor's own when it names one, else
// asio's deferred, as later Asio releases default to.
template <typename Executor>
using default_token_t =
    std::conditional_t<std::is_void_v<asio::default_completion_token_t<Executor>>,
                       asio::experimental::deferred_t, asio::default_completion_token_t<Executor>>;

}  // namespace dlasync::detail
