// python/src/py_async.hpp
//
// One import started from Python, and how its completion reaches Python.
//
// An `import_call` is the state of one import or batch. Its completion
// handler runs on the module's completion thread (completion_executor()),
// never on the runtime's executor: a handler there would never run for an
// import refused after shutdown, whose executor no longer runs. It never
// takes the GIL. For the synchronous form, the calling thread waits on the
// call with the GIL released. For asyncio, the handler queues the call on
// the event loop's `loop_bridge` and writes the bridge's eventfd; the loop
// (which watches the fd with add_reader) drains the queue on its own
// thread and resolves the futures. No thread is blocked per import.
//
// Cancellation: cancel() emits terminal cancellation on the completion
// thread, where Asio's slot is also cleared before the handler runs, so
// that the two never race. A call whose handler is destroyed without being called
// (the runtime shut down with it queued) completes with Unavailable.
#pragma once

#include <pybind11/pybind11.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "asio/cancellation_signal.hpp"
#include "asio/execution.hpp"
#include "asio/io_context.hpp"
#include "asio/query.hpp"
#include "asio/system_executor.hpp"
#include "dlasync/runtime.hpp"
#include "dlasync/tensor.hpp"
#include "py_release.hpp"

namespace dlasync::python {

class loop_bridge;

// The executor of the module's completion thread, started at first use.
asio::io_context::executor_type completion_executor();
// Runs what is queued there and stops the thread (at exit, after the
// runtimes have shut down; the GIL is given up while it waits).
void stop_completions();

class import_call : public std::enable_shared_from_this<import_call> {
 public:
  using strand_type = asio::io_context::executor_type;

  import_call() : strand_(completion_executor()) {}

  strand_type strand() const noexcept { return strand_; }
  asio::cancellation_slot slot() noexcept { return signal_.slot(); }

  // Any thread, any number of times; nothing once completed.
  void cancel();
  // Completed without an operation (a view resolved at the call).
  void mark_done();

  // The handler's end: stores the result and wakes whoever waits.
  void complete(absl::StatusOr<tensor> one);
  void complete(std::vector<absl::StatusOr<tensor>> many);

  // Synchronous form: waits with the GIL released, checking for signals
  // every 100 ms; a signal's exception (KeyboardInterrupt) is raised at
  // once, and the import, abandoned, releases its result where it ends.
  absl::StatusOr<tensor> wait_one();

  // Asyncio form (set before the import starts, the GIL held).
  py_ref future;
  py_ref owner;  // the Python Runtime
  std::shared_ptr<loop_bridge> bridge;
  bool return_exceptions = false;

  // Read by the bridge once completed (the GIL held).
  std::optional<absl::StatusOr<tensor>> one;
  std::optional<std::vector<absl::StatusOr<tensor>>> many;

 private:
  void finished();

  strand_type strand_;
  asio::cancellation_signal signal_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
};

// An executor that runs what it is given at once, on the calling thread:
// the synchronous form's handler only stores the result and wakes the
// waiting thread, which costs less than a hop to another thread. It answers
// blocking.never to Asio's post, as use_future's executor does, although
// it runs the function inline: nothing here waits for the caller.
struct inline_executor {
  template <typename F>
  void execute(F&& f) const {
    std::forward<F>(f)();
  }
  static constexpr asio::execution::blocking_t query(asio::execution::blocking_t) noexcept {
    return asio::execution::blocking.never;
  }
  inline_executor require(asio::execution::blocking_t::never_t) const noexcept { return *this; }
  asio::execution_context& query(asio::execution::context_t) const noexcept {
    return asio::query(asio::system_executor(), asio::execution::context);
  }
  friend bool operator==(const inline_executor&, const inline_executor&) noexcept { return true; }
  friend bool operator!=(const inline_executor&, const inline_executor&) noexcept { return false; }
};

// The synchronous form's handler: no cancellation slot (an interrupted
// wait abandons the import, whose result is then released where it ends).
class sync_handler {
 public:
  using executor_type = inline_executor;

  explicit sync_handler(std::shared_ptr<import_call> call) : call_(std::move(call)) {}
  sync_handler(sync_handler&&) noexcept = default;
  sync_handler& operator=(sync_handler&&) noexcept = default;
  ~sync_handler() {
    if (call_ != nullptr) {
      call_->complete(absl::StatusOr<tensor>(absl::UnavailableError(
          "the runtime shut down before this import's completion could be delivered; the "
          "tensor was released")));
    }
  }

  executor_type get_executor() const noexcept { return {}; }

  void operator()(absl::StatusOr<tensor> result) {
    std::shared_ptr<import_call> call = std::move(call_);
    call_ = nullptr;
    call->complete(std::move(result));
  }

 private:
  std::shared_ptr<import_call> call_;
};

// The asyncio form's handler: on the completion thread, with the call's
// cancellation slot.
template <typename Result>
class call_handler {
 public:
  using executor_type = import_call::strand_type;
  using cancellation_slot_type = asio::cancellation_slot;

  call_handler(std::shared_ptr<import_call> call, std::size_t members)
      : executor_(call->strand()), slot_(call->slot()), call_(std::move(call)), members_(members) {}
  call_handler(call_handler&&) noexcept = default;
  call_handler& operator=(call_handler&&) noexcept = default;
  ~call_handler() {
    if (call_ == nullptr) return;
    const absl::Status gone = absl::UnavailableError(
        "the runtime shut down before this import's completion could be delivered; the "
        "tensor was released");
    if constexpr (std::is_same_v<Result, absl::StatusOr<tensor>>) {
      call_->complete(absl::StatusOr<tensor>(gone));
    } else {
      call_->complete(std::vector<absl::StatusOr<tensor>>(members_, gone));
    }
  }

  executor_type get_executor() const noexcept { return executor_; }
  cancellation_slot_type get_cancellation_slot() const noexcept { return slot_; }

  void operator()(Result result) {
    std::shared_ptr<import_call> call = std::move(call_);
    call_ = nullptr;
    call->complete(std::move(result));
  }

 private:
  executor_type executor_;
  cancellation_slot_type slot_;
  std::shared_ptr<import_call> call_;
  std::size_t members_;
};

// The asyncio side of one event loop: an eventfd the loop watches and the
// calls completed since it last looked.
class loop_bridge {
 public:
  loop_bridge();
  ~loop_bridge();
  loop_bridge(const loop_bridge&) = delete;
  loop_bridge& operator=(const loop_bridge&) = delete;

  int fd() const noexcept { return fd_; }
  // Any thread.
  void push(std::shared_ptr<import_call> call);
  // On the loop's thread (the GIL held): resolves the futures of the calls
  // queued so far; a future already done (cancelled) just drops its result.
  void drain();

 private:
  static void resolve(import_call& call);

  int fd_ = -1;
  std::mutex mutex_;
  std::vector<std::shared_ptr<import_call>> queue_;
};

// The Python result of a completed call (a Tensor, a list) or raises.
pybind11::object tensor_object(tensor t, const py_ref& owner);

}  // namespace dlasync::python
