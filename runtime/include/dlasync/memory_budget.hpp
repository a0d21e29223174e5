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
// on the thread that calls acquire (immediate grant or refusal), release or
// cancel, never under the budget's lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>

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
  std::uint64_t in_use() const;
  // Requests waiting in line; reads no lock (runtime::stats reads it).
  std::size_t waiting() const noexcept { return waiting_.load(std::memory_order_relaxed); }

 private:
  struct waiter {
    std::uint64_t ticket;
    std::uint64_t bytes;
    grant_fn fn;
  };

  const std::uint64_t limit_;
  mutable std::mutex mutex_;
  std::uint64_t in_use_ = 0;
  std::uint64_t next_ticket_ = 1;
  std::deque<waiter> waiters_;
  // waiters_.size(), kept under the lock.
  std::atomic<std::size_t> waiting_{0};
};

}  // namespace dlasync
