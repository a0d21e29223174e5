// Where the CUDA reactor hands its completions (internal). The reactor only
// polls events; what follows an event (a marker's callbacks: a deleter, the
// next staging piece, the grant of the next import, a handler's delivery)
// runs on the executor this names: the runtime's workers, or the worker
// executor the caller gave in runtime_options. Once the runtime has begun
// to stop its workers it is detached, and completions run on the reactor
// thread itself, so that none is lost to a pool that no longer runs.
//
// Thread safety: all members are safe from any thread.
#pragma once

#include <mutex>
#include <optional>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "asio/any_io_executor.hpp"
#include "asio/post.hpp"

namespace dlasync::detail {

class handoff {
 public:
  using task = absl::AnyInvocable<void() &&>;

  void attach(asio::any_io_executor executor) {
    std::lock_guard lock(mutex_);
    executor_ = std::move(executor);
  }

  // After this returns, no task is posted any more: later ones run inline.
  void detach() {
    std::lock_guard lock(mutex_);
    executor_.reset();
  }

  // Posts `fn` to the attached executor, or runs it here when detached.
  void run(task fn) {
    {
      std::lock_guard lock(mutex_);
      if (executor_) {
        // Posted under the lock: a detach that returned has seen every post.
        asio::post(*executor_, [fn = std::move(fn)]() mutable { std::move(fn)(); });
        return;
      }
    }
    std::move(fn)();
  }

 private:
  std::mutex mutex_;
  std::optional<asio::any_io_executor> executor_;
};

}  // namespace dlasync::detail
