// `dlasync::completion_marker` (internal) is a one-shot signal with a
// status: what a backend records on a stream to say "everything enqueued
// before this has completed" (a CUDA event watched by the reactor, a queue
// entry of a host stream). Shared by `marker_ptr`.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"

namespace dlasync {

class completion_marker {
 public:
  using callback = absl::AnyInvocable<void(absl::Status) &&>;

  bool done() const;

  // Calls `fn(status)` exactly once: at once on this thread when already
  // done, else on the thread that calls `complete`.
  void on_complete(callback fn);

  // Registers `fn` as on_complete does when the marker is not done yet, and
  // returns nothing; when it is done, leaves `fn` alone and returns the
  // status, for the caller to run `fn` where it should run.
  std::optional<absl::Status> on_complete_unless_done(callback& fn);

  // Marks the marker done with `status` and runs the callbacks; only the
  // first call counts.
  void complete(const absl::Status& status);

 private:
  mutable std::mutex mutex_;
  bool done_ = false;
  absl::Status status_;
  std::vector<callback> callbacks_;
};

using marker_ptr = std::shared_ptr<completion_marker>;

// A marker completed already with `status`.
marker_ptr done_marker(const absl::Status& status);

// The status of a marker that completed as it was made (nothing was
// recorded, or recording failed), else OK.
absl::Status failed_at_once(const marker_ptr& m);

}  // namespace dlasync
