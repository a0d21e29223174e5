// A host stream (internal): an in-order queue of tasks run on the runtime's
// worker pool, one at a time. The next task starts when the running one
// calls its `done`. A task that calls `done` before it returns, or from a
// worker thread, has the next task run on that thread at once; only a
// `done` from elsewhere (a reactor, another executor) posts it: each post
// may cost a thread wake-up.
//
// Thread safety: `enqueue` is safe from any thread.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>

#include "absl/functional/any_invocable.h"
#include "runtime/src/work_pool.hpp"

namespace dlasync::detail {

class host_stream {
 public:
  using done_fn = absl::AnyInvocable<void() &&>;
  using task = absl::AnyInvocable<void(done_fn) &&>;

  explicit host_stream(work_pool& pool) : pool_(pool) {}

  // Runs `t` after every task enqueued before it has called its `done`.
  void enqueue(task t);

 private:
  // What became of the running task first: its `done` was called, or it
  // returned. One task runs at a time, and the next starts only after both,
  // so one phase serves them all.
  enum : int { running = 0, done_first = 1, returned_first = 2 };

  void start_next();

  work_pool& pool_;
  std::mutex mutex_;
  std::deque<task> queue_;
  bool running_ = false;
  std::atomic<int> phase_{running};
};

}  // namespace dlasync::detail
