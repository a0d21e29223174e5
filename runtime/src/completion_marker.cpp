#include "runtime/src/completion_marker.hpp"

namespace dlasync {

bool completion_marker::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void completion_marker::on_complete(callback fn) {
  absl::Status status;
  {
    std::lock_guard lock(mutex_);
    if (!done_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
    status = status_;
  }
  std::move(fn)(std::move(status));
}

std::optional<absl::Status> completion_marker::on_complete_unless_done(callback& fn) {
  std::lock_guard lock(mutex_);
  if (done_) return status_;
  callbacks_.push_back(std::move(fn));
  return std::nullopt;
}

void completion_marker::complete(const absl::Status& status) {
  std::vector<callback> callbacks;
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    done_ = true;
    status_ = status;
    callbacks.swap(callbacks_);
  }
  for (callback& fn : callbacks) std::move(fn)(status);
}

marker_ptr done_marker(const absl::Status& status) {
  auto m = std::make_shared<completion_marker>();
  m->complete(status);
  return m;
}

absl::Status failed_at_once(const marker_ptr& m) {
  absl::Status status;
  if (m->done()) m->on_complete([&status](absl::Status s) { status = std::move(s); });
  return status;
}

}  // namespace dlasync
