// Where producers' DLPack deleters run (internal): one thread of the
// runtime's own, apart from the workers and the CUDA reactor. A deleter is
// user code and may block (a Python deleter waits for the GIL, a producer
// returns memory to a pool under its lock); on a worker it held that worker,
// and as many blocking at once as there were workers stalled every import.
// Here a deleter that blocks holds up only the deleters behind it, never an
// import.
//
// Tasks run one at a time, in the order they were handed over, on a thread
// started by the first one (a runtime that never hands one over starts
// none). drain() waits until every task handed over has run and stops the
// thread; a task handed over afterwards runs at once, on the thread that
// hands it over, so that none is lost.
//
// A task must not throw: the runtime's tasks release DLPack tensors, whose
// deleters are C functions called from noexcept code, so an exception ends
// the process wherever it is thrown. A task may hand over another (a
// deleter that starts an import); it runs after this one. A task must not
// wait for drain(): it would wait for itself.
//
// Example:
//
//   releaser r;
//   r.post([t = std::move(source)]() mutable { t.reset(); });  // any thread
//   r.drain();  // the deleter has run
//
// Thread safety: all members are safe from any thread.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"

namespace dlasync::detail {

class releaser {
 public:
  using task = absl::AnyInvocable<void() &&>;

  releaser() = default;
  releaser(const releaser&) = delete;
  releaser& operator=(const releaser&) = delete;
  ~releaser() { drain(); }

  // Runs `fn` on the releaser's thread after every task handed over before
  // it, never inside this call; once drained (or when no thread can be
  // started), here.
  void post(task fn);

  // Waits until every task handed over, those they hand over included, has
  // run, then stops the thread. Concurrent callers all return once that is
  // done. Must not be called from a task.
  void drain();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;     // the thread sleeps on it
  std::condition_variable stopped_;  // drain() waits on it
  std::vector<task> queue_;
  std::thread thread_;
  bool sleeping_ = false;  // the thread waits for wake_
  bool draining_ = false;  // drain() has begun
  bool done_ = false;      // and every task has run: post() runs them here
};

}  // namespace dlasync::detail
