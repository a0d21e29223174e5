// Where the CUDA reactor hands its completions (internal). The reactor only
// polls events; what follows an event (a marker's callbacks: the hand-off
// of a source to the releaser, the next staging piece, the grant of the
// next import, a handler's delivery) runs on the workers this names
// (work_pool: the runtime's own threads, or the worker executor the caller
// gave in runtime_options), posted as their counted tasks, so that a worker
// lingering for a split copy makes way for it. Once the runtime has begun
// to stop its workers it is detached, and completions run on the reactor
// thread itself, so that none is lost to a pool that no longer runs.
//
// Thread safety: all members are safe from any thread.
#pragma once

#include <mutex>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "runtime/src/work_pool.hpp"

namespace dlasync::detail {

class handoff {
 public:
  using task = absl::AnyInvocable<void() &&>;

  void attach(work_pool& workers) {
    std::lock_guard lock(mutex_);
    workers_ = &workers;
  }

  // After this returns, no task is posted any more: later ones run inline.
  void detach() {
    std::lock_guard lock(mutex_);
    workers_ = nullptr;
  }

  // Posts `fn` to the attached workers, or runs it here when detached.
  void run(task fn) {
    {
      std::lock_guard lock(mutex_);
      if (workers_ != nullptr) {
        // Posted under the lock: a detach that returned has seen every post.
        workers_->post(std::move(fn));
        return;
      }
    }
    std::move(fn)();
  }

 private:
  std::mutex mutex_;
  work_pool* workers_ = nullptr;
};

}  // namespace dlasync::detail
