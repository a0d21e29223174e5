#include "runtime/src/budget_wait.hpp"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dlasync::detail {

absl::Status within_budget(absl::string_view what, std::uint64_t bytes, std::uint64_t limit,
                           absl::string_view also) {
  if (limit == 0 || bytes <= limit) return absl::OkStatus();
  std::string message = absl::StrCat(what, " needs ", bytes,
                                     " bytes, more than the whole copy memory budget of ", limit,
                                     " bytes; not consumed: raise "
                                     "runtime_options::copy_memory_budget");
  if (!also.empty()) absl::StrAppend(&message, ", or ", also);
  return absl::ResourceExhaustedError(message);
}

void budget_wait::begin(std::uint64_t bytes, memory_budget::grant_fn granted, acquire_fn acquire) {
  {
    std::lock_guard lock(mutex_);
    state_ = state::asking;
  }
  const std::uint64_t ticket = acquire(bytes, std::move(granted));
  absl::Status why;
  {
    std::lock_guard lock(mutex_);
    if (state_ == state::over) return;  // granted or refused already
    state_ = state::waiting;
    ticket_ = ticket;
    if (!pending_) return;
    why = *std::move(pending_);
    pending_.reset();
  }
  // When the budget granted it meanwhile, the handler has its grant, and
  // the owner's own cancelled state tells it to give the bytes back.
  (void)budget_.cancel(ticket, std::move(why));
}

void budget_wait::end() {
  std::lock_guard lock(mutex_);
  state_ = state::over;
  pending_.reset();
}

budget_wait::outcome budget_wait::cancel(absl::Status why) {
  std::uint64_t ticket = 0;
  {
    std::lock_guard lock(mutex_);
    switch (state_) {
      case state::over: return outcome::not_waiting;
      case state::idle:
      case state::asking:
        if (!pending_) pending_ = std::move(why);
        return outcome::deferred;
      case state::waiting: ticket = ticket_; break;
    }
  }
  return budget_.cancel(ticket, std::move(why)) ? outcome::ended : outcome::granted;
}

bool budget_wait::waiting() const {
  std::lock_guard lock(mutex_);
  return state_ == state::asking || state_ == state::waiting;
}

}  // namespace dlasync::detail
