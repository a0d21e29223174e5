#include "dlasync/memory_budget.hpp"

#include <vector>

#include "runtime/src/budget_wait.hpp"

namespace dlasync {

std::uint64_t memory_budget::acquire(std::uint64_t bytes, grant_fn fn) {
  std::unique_lock lock(mutex_);
  const std::uint64_t ticket = next_ticket_++;
  // Callers check the rule before they ask (the transfer plan, a batch, a
  // remote import); a request that could never be granted must not wait.
  if (absl::Status over = detail::within_budget("a copy", bytes, limit_); !over.ok()) {
    lock.unlock();
    std::move(fn)(std::move(over));
    return ticket;
  }
  if (waiters_.empty() && (limit_ == 0 || limit_ - in_use_ >= bytes)) {
    in_use_ += bytes;
    lock.unlock();
    std::move(fn)(absl::OkStatus());
    return ticket;
  }
  waiters_.push_back({ticket, bytes, std::move(fn)});
  waiting_.store(waiters_.size(), std::memory_order_relaxed);
  return ticket;
}

bool memory_budget::try_acquire(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (!waiters_.empty() || (limit_ != 0 && (bytes > limit_ || limit_ - in_use_ < bytes))) {
    return false;
  }
  in_use_ += bytes;
  return true;
}

bool memory_budget::cancel(std::uint64_t ticket, absl::Status why) {
  grant_fn fn;
  {
    std::lock_guard lock(mutex_);
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
      if (it->ticket == ticket) {
        fn = std::move(it->fn);
        waiters_.erase(it);
        waiting_.store(waiters_.size(), std::memory_order_relaxed);
        break;
      }
    }
  }
  if (!fn) return false;
  std::move(fn)(std::move(why));
  // A large waiter leaving the head may let smaller ones in.
  release(0);
  return true;
}

void memory_budget::release(std::uint64_t bytes) {
  std::vector<grant_fn> granted;
  {
    std::lock_guard lock(mutex_);
    in_use_ -= bytes;
    while (!waiters_.empty() && (limit_ == 0 || limit_ - in_use_ >= waiters_.front().bytes)) {
      in_use_ += waiters_.front().bytes;
      granted.push_back(std::move(waiters_.front().fn));
      waiters_.pop_front();
    }
    if (!granted.empty()) waiting_.store(waiters_.size(), std::memory_order_relaxed);
  }
  for (grant_fn& fn : granted) std::move(fn)(absl::OkStatus());
}

std::uint64_t memory_budget::in_use() const {
  std::lock_guard lock(mutex_);
  return in_use_;
}

}  // namespace dlasync
