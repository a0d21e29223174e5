// dlasync/memory_budget.hpp
//
// `dlasync::memory_budget` bounds the bytes that copies may hold at once.
// A request that fits is granted at once; one that does not waits, in
// arrival order, until earlier holders release enough; one larger than the
// whole budget is refused with ResourceExhausted. Waiting blocks no thread:
// the grant is a callback.
//
// Example:
//
//   auto budget = std::make_shared<dlasync::memory_budget>(1 << 30);
//   auto ticket = budget->acquire(bytes, [](absl::Status s) { ... });
//   budget->cancel(ticket, absl::CancelledError("import cancelled"));
//   budget->release(bytes);  // after a grant, when the memory is freed
//
// Thread safety: all members are safe to call from any thread. Callbacks run
// on the thread that calls acquire, release or cancel, never under the
// budget's lock. try_acquire, and a release while nobody waits, take no lock:
// an atomic read and a compare-and-swap, or one atomic subtraction.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"

namespace dlasync {

class memory_budget {
 public:
  using grant_fn = absl::AnyInvocable<void(absl::Status) &&>;

  // `limit` bytes; 0 means unlimited.
  explicit memory_budget(std::uint64_t limit) noexcept : limit_(limit) {}

  // Reserves `bytes` and calls `fn(OkStatus())` when they are granted, or
  // `fn(status)` when refused or cancelled; exactly once. Returns a ticket
  // for `cancel`.
  std::uint64_t acquire(std::uint64_t bytes, grant_fn fn);

  // Reserves `bytes` only when they can be granted at once (they fit and
  // nobody waits); true when granted. Never refuses with an error.
  bool try_acquire(std::uint64_t bytes);

  // Ends the wait of `ticket` with `why`; false when it was already granted
  // or refused.
  bool cancel(std::uint64_t ticket, absl::Status why);

  // Returns granted bytes.
  void release(std::uint64_t bytes);

  std::uint64_t limit() const noexcept { return limit_; }
  std::uint64_t in_use() const noexcept { return in_use_.load(std::memory_order_acquire); }
  // Requests waiting in line; reads no lock (runtime::stats reads it).
  std::size_t waiting() const noexcept { return waiting_.load(std::memory_order_relaxed); }

 private:
  struct waiter {
    std::uint64_t ticket;
    std::uint64_t bytes;
    grant_fn fn;
  };

  // Takes `bytes` from in_use_ when they fit under the limit; lock-free.
  bool take(std::uint64_t bytes) noexcept;
  // Grants waiters from the head while they fit; under mutex_. Returns the
  // callbacks to run once the lock is let go.
  std::vector<grant_fn> grant_locked();

  const std::uint64_t limit_;
  mutable std::mutex mutex_;
  // Bytes granted. Changed without the lock (take, release), so that a copy
  // that fits while nobody waits costs one atomic instruction each way.
  std::atomic<std::uint64_t> in_use_{0};
  std::uint64_t next_ticket_ = 1;
  std::deque<waiter> waiters_;
  // waiters_.size(), written under the lock. A release reads it after it
  // gives its bytes back, and a request that starts to wait reads in_use_
  // after it writes it (both sequentially consistent): so either the
  // release sees the waiter and grants it, or the waiter sees the bytes.
  std::atomic<std::size_t> waiting_{0};
};

}  // namespace dlasync
