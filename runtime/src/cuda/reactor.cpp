#include "runtime/src/cuda/reactor.hpp"

#include <chrono>

namespace dlasync::detail {
namespace {

// Calls of cudaEventQuery that must fail in a row before the reactor takes
// an error for a failed context rather than a passing fault.
constexpr int persistent_query_failures = 3;

}  // namespace

reactor::reactor(cuda::api& api) : api_(api) {
  thread_ = std::thread([this] { poll(); });
}

reactor::~reactor() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  round_done_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void reactor::watch(int device, cuda::event_t e, std::function<void(absl::Status)> done) {
  {
    std::lock_guard lock(mutex_);
    watched_.push_back({device, e, std::move(done)});
  }
  wake_.notify_one();
}

void reactor::quiesce() {
  if (on_reactor_thread()) return;
  std::unique_lock lock(mutex_);
  const std::uint64_t target = rounds_started_;
  round_done_.wait(lock, [&] { return rounds_finished_ >= target || stop_; });
}

void reactor::poll() {
  int idle_rounds = 0;
  while (true) {
    std::vector<watched> batch;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stop_ || !watched_.empty(); });
      if (stop_) return;  // only after every import has finished
      batch.swap(watched_);
      ++rounds_started_;
    }
    std::vector<watched> pending;
    bool progressed = false;
    for (watched& w : batch) {
      const cuda::error err = api_.event_query(w.event);
      if (err == cuda::error::not_ready) {
        w.failures = 0;
        pending.push_back(std::move(w));
        continue;
      }
      if (err != cuda::error::success) {
        // A failed query does not say the work is done: ask again, and
        // report the error once the event completes. Only an error that
        // persists (a failed context, whose work never runs) ends the
        // watch at once.
        if (w.first_error == cuda::error::success) w.first_error = err;
        if (++w.failures < persistent_query_failures) {
          pending.push_back(std::move(w));
          continue;
        }
      }
      progressed = true;
      w.done(w.first_error == cuda::error::success
                 ? absl::OkStatus()
                 : cuda::to_status(w.first_error, "a stream operation (cudaEventQuery)", w.device));
    }
    {
      std::lock_guard lock(mutex_);
      watched_.insert(watched_.begin(), std::make_move_iterator(pending.begin()),
                      std::make_move_iterator(pending.end()));
      ++rounds_finished_;
    }
    round_done_.notify_all();
    if (progressed) {
      idle_rounds = 0;
    } else if (++idle_rounds > 64) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace dlasync::detail
