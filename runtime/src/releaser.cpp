#include "runtime/src/releaser.hpp"

#include <system_error>
#include <utility>

namespace dlasync::detail {

void releaser::post(task fn) {
  std::unique_lock lock(mutex_);
  if (!done_ && !thread_.joinable() && !draining_) {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {
      // No thread to be had (the process is out of them): the task runs
      // here, late rather than never.
    }
  }
  if (done_ || (!thread_.joinable() && !draining_)) {
    lock.unlock();
    std::move(fn)();
    return;
  }
  queue_.push_back(std::move(fn));
  // Woken under the lock: once the lock is let go, a drain may end and the
  // releaser go, so nothing of it is touched after.
  if (sleeping_) wake_.notify_one();
}

void releaser::run() {
  std::vector<task> batch;
  std::unique_lock lock(mutex_);
  for (;;) {
    while (queue_.empty() && !draining_) {
      sleeping_ = true;
      wake_.wait(lock);
      sleeping_ = false;
    }
    if (queue_.empty()) break;  // draining, and nothing is left
    batch.swap(queue_);
    lock.unlock();
    for (task& fn : batch) std::move(fn)();
    batch.clear();
    lock.lock();
  }
  done_ = true;
  stopped_.notify_all();
}

void releaser::drain() {
  std::unique_lock lock(mutex_);
  if (draining_) {
    // Another caller stops the thread: return once every task has run.
    stopped_.wait(lock, [this] { return done_; });
    return;
  }
  draining_ = true;
  if (!thread_.joinable()) {
    done_ = true;  // never started: nothing was handed over
    return;
  }
  std::thread running = std::move(thread_);
  wake_.notify_one();
  lock.unlock();
  running.join();
}

}  // namespace dlasync::detail
