// One operation's wait for copy budget (internal): the protocol every
// operation that waits for memory_budget follows (an import, a batch, a
// remote import), written once. It knows whether the wait is under way and
// under which ticket, so that a cancellation from any thread ends it, also
// one that comes before the ticket is known (it is then carried out as
// soon as the ticket is).
//
//   begin   asks for the bytes; the grant handler runs exactly once, with
//           OK or why not, maybe inside the call
//   end     the grant handler's first step: the wait is over
//   cancel  ends a wait under way; says whether the grant was on its way
//
// Thread safety: every member may be called from any thread. The budget's
// calls (acquire, cancel) run outside the wait's lock, because a grant
// handler may run inside them and call end().
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "dlasync/memory_budget.hpp"

namespace dlasync::detail {

// OK when `bytes`, what `what` needs ("a copy", "this batch of 3
// tensors"), fit a budget of `limit` (0: unlimited); else the one
// ResourceExhausted of the rule, with `also` (what else the caller can do)
// appended to the advice when not empty.
absl::Status within_budget(absl::string_view what, std::uint64_t bytes, std::uint64_t limit,
                           absl::string_view also = {});

class budget_wait {
 public:
  // How the budget is asked: memory_budget::acquire itself, or a wrapper
  // that hands a late grant to other threads.
  using acquire_fn =
      absl::FunctionRef<std::uint64_t(std::uint64_t bytes, memory_budget::grant_fn granted)>;

  explicit budget_wait(memory_budget& budget) noexcept : budget_(budget) {}

  // Asks for `bytes`; `granted` runs exactly once. At most once per wait.
  void begin(std::uint64_t bytes, memory_budget::grant_fn granted, acquire_fn acquire);

  // Marks the wait over: the grant handler calls it first.
  void end();

  enum class outcome {
    not_waiting,  // over: its grant handler has run
    ended,        // the grant handler runs (or ran) with `why`
    deferred,     // not begun, or its ticket not known yet: ended with `why`
                  // as soon as it is, unless the budget grants it first
    granted,      // the budget had granted it: the grant is on its way
  };
  // Ends the wait with `why`.
  outcome cancel(absl::Status why);

  bool waiting() const;

 private:
  enum class state { idle, asking, waiting, over };

  memory_budget& budget_;
  mutable std::mutex mutex_;
  state state_ = state::idle;
  std::uint64_t ticket_ = 0;
  std::optional<absl::Status> pending_;  // a cancel that came before the ticket
};

}  // namespace dlasync::detail
