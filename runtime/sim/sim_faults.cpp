#include "runtime/sim/sim_api.hpp"

#include "runtime/sim/sim_state.hpp"

namespace dlasync::cuda {

void sim_api::fail_call(const std::string& call, int nth, error e, bool sticky) {
  std::lock_guard lock(mutex_);
  call_faults_[call].push_back({call_counts_[call] + static_cast<std::uint64_t>(nth), e, sticky});
}

void sim_api::fail_nth_call(std::uint64_t k, error e, bool sticky) {
  std::lock_guard lock(mutex_);
  nth_faults_.push_back({calls_.load() + k, e, sticky});
}

void sim_api::make_sticky(error e) {
  {
    std::lock_guard lock(mutex_);
    fail_context_locked(e);
  }
  context_failed();
}

void sim_api::fail_context_locked(error e) {
  sticky_ = e;
  ++failures_;
  // Queued work never runs now: it can no longer race with anything. In
  // the same hold of mutex_ as the failure, which work is stamped under.
  checker_.host_learns_everything();
}

void sim_api::context_failed() {
  wake_event_waiters();
  // The device stops: copies and kernels already running finish before
  // anyone learns of the failure, later ones never start.
  std::unique_lock stop(running_);
}

std::uint64_t sim_api::epoch() const {
  std::lock_guard lock(mutex_);
  return failures_;
}

bool sim_api::failed_since(std::uint64_t epoch) const {
  std::lock_guard lock(mutex_);
  return sticky_ != error::success || failures_ != epoch;
}

void sim_api::wake_event_waiters() {
  std::vector<std::shared_ptr<event>> events;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [handle, ev] : events_) events.push_back(ev);
  }
  // Streams waiting for an event re-check the context under the event's
  // lock; taking it here means none of them misses this wake-up.
  for (const std::shared_ptr<event>& ev : events) {
    std::lock_guard lock(ev->mutex);
    ev->done.notify_all();
  }
}

void sim_api::clear_faults() {
  std::lock_guard lock(mutex_);
  sticky_ = error::success;
  call_faults_.clear();
  nth_faults_.clear();
}

error sim_api::sticky_error() const {
  std::lock_guard lock(mutex_);
  return sticky_;
}

std::map<std::string, std::uint64_t> sim_api::call_counts() const {
  std::lock_guard lock(mutex_);
  return call_counts_;
}

error sim_api::enter(const char* call) {
  const std::uint64_t n = ++calls_;
  bool became_sticky = false;
  const error result = [&] {
    std::lock_guard lock(mutex_);
    const std::uint64_t nth_of_call = ++call_counts_[call];
    if (sticky_ != error::success) return sticky_;
    for (auto it = nth_faults_.begin(); it != nth_faults_.end(); ++it) {
      if (it->call == n) {
        const error e = it->e;
        if (it->sticky) {
          fail_context_locked(e);
          became_sticky = true;
        }
        nth_faults_.erase(it);
        return e;
      }
    }
    auto faults = call_faults_.find(call);
    if (faults != call_faults_.end()) {
      for (auto it = faults->second.begin(); it != faults->second.end(); ++it) {
        if (it->call == nth_of_call) {
          const error e = it->e;
          if (it->sticky) {
            fail_context_locked(e);
            became_sticky = true;
          }
          faults->second.erase(it);
          return e;
        }
      }
    }
    return error::success;
  }();
  if (became_sticky) context_failed();
  return result;
}

}  // namespace dlasync::cuda
