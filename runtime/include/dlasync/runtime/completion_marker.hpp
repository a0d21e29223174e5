// dlasync/runtime/completion_marker.hpp
//
// `dlasync::completion_marker` is a one-shot signal with a status: what a
// backend records on a stream to say "everything enqueued before this has
// completed" (a CUDA event on the CUDA backend, a queue entry on the host
// backend). Shared by `marker_ptr`.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <memory>
#include <mutex>
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

  // Marks the marker done with `status` and runs the callbacks; only the
  // first call counts.
  void complete(absl::Status status);

 private:
  mutable std::mutex mutex_;
  bool done_ = false;
  absl::Status status_;
  std::vector<callback> callbacks_;
};

using marker_ptr = std::shared_ptr<completion_marker>;

}  // namespace dlasync
