#include "dlasync/memory_budget.hpp"

#include <vector>

#include "runtime/src/budget_wait.hpp"

namespace dlasync {

bool memory_budget::take(std::uint64_t bytes) noexcept {
  if (limit_ == 0) {
    in_use_.fetch_add(bytes, std::memory_order_seq_cst);
    return true;
  }
  // Sequentially consistent: after a waiter's store of waiting_ this read
  // must see a release that missed the waiter (memory_budget.hpp).
  std::uint64_t used = in_use_.load(std::memory_order_seq_cst);
  do {
    if (limit_ - used < bytes) return false;
  } while (!in_use_.compare_exchange_weak(used, used + bytes, std::memory_order_seq_cst,
                                          std::memory_order_relaxed));
  return true;
}

std::vector<memory_budget::grant_fn> memory_budget::grant_locked() {
  std::vector<grant_fn> granted;
  while (!waiters_.empty() && take(waiters_.front().bytes)) {
    granted.push_back(std::move(waiters_.front().fn));
    waiters_.pop_front();
  }
  if (!granted.empty()) waiting_.store(waiters_.size(), std::memory_order_seq_cst);
  return granted;
}

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
  if (waiters_.empty() && take(bytes)) {
    lock.unlock();
    std::move(fn)(absl::OkStatus());
    return ticket;
  }
  waiters_.push_back({ticket, bytes, std::move(fn)});
  waiting_.store(waiters_.size(), std::memory_order_seq_cst);
  // A release between the take above and the store may not have seen this
  // waiter: look at what it gave back.
  std::vector<grant_fn> granted = grant_locked();
  lock.unlock();
  for (grant_fn& g : granted) std::move(g)(absl::OkStatus());
  return ticket;
}

bool memory_budget::try_acquire(std::uint64_t bytes) {
  if (limit_ != 0 && bytes > limit_) return false;
  // Nobody jumps the line: a request that waits is granted first.
  if (waiting_.load(std::memory_order_seq_cst) != 0) return false;
  return take(bytes);
}

bool memory_budget::cancel(std::uint64_t ticket, absl::Status why) {
  grant_fn fn;
  std::vector<grant_fn> granted;
  {
    std::lock_guard lock(mutex_);
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
      if (it->ticket == ticket) {
        fn = std::move(it->fn);
        waiters_.erase(it);
        waiting_.store(waiters_.size(), std::memory_order_seq_cst);
        // A large waiter leaving the head may let smaller ones in.
        granted = grant_locked();
        break;
      }
    }
  }
  if (!fn) return false;
  std::move(fn)(std::move(why));
  for (grant_fn& g : granted) std::move(g)(absl::OkStatus());
  return true;
}

void memory_budget::release(std::uint64_t bytes) {
  in_use_.fetch_sub(bytes, std::memory_order_seq_cst);
  if (waiting_.load(std::memory_order_seq_cst) == 0) return;
  std::vector<grant_fn> granted;
  {
    std::lock_guard lock(mutex_);
    granted = grant_locked();
  }
  for (grant_fn& fn : granted) std::move(fn)(absl::OkStatus());
}

}  // namespace dlasync
