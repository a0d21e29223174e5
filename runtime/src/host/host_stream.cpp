#include "runtime/src/host/host_stream.hpp"

namespace dlasync::detail {

void host_stream::enqueue(task t) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(t));
    if (running_) return;
    running_ = true;
  }
  pool_.post([this] { start_next(); });
}

void host_stream::start_next() {
  while (true) {
    task t;
    {
      std::lock_guard lock(mutex_);
      if (queue_.empty()) {
        running_ = false;
        return;
      }
      t = std::move(queue_.front());
      queue_.pop_front();
    }
    phase_.store(running);
    std::move(t)([this] {
      int expected = running;
      if (phase_.compare_exchange_strong(expected, done_first, std::memory_order_acq_rel)) {
        return;  // before the task returned: the loop below goes on
      }
      if (pool_.running_in_this_thread()) {
        start_next();  // a worker, outside the task: no recursion
      } else {
        pool_.post([this] { start_next(); });
      }
    });
    int expected = running;
    if (phase_.compare_exchange_strong(expected, returned_first, std::memory_order_acq_rel)) {
      return;  // `done` comes later and starts the next task
    }
  }
}

}  // namespace dlasync::detail
