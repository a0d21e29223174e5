// Threads for a directory's awaitable waits (internal): each wait blocks a
// thread of its own, so that waits for several names go on together and
// none queues behind another, or behind a withdrawal. At most `most` run at
// once; join() waits for those started and refuses any later.
//
// Thread safety: all members are safe to call from any thread, but for the
// destructor, which joins.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"

namespace dlasync::remote_detail {

class wait_threads {
 public:
  explicit wait_threads(std::size_t most) : most_(most) {}
  wait_threads(const wait_threads&) = delete;
  wait_threads& operator=(const wait_threads&) = delete;
  ~wait_threads() { join(); }

  // What a job does once its thread's place is free again: it tells its
  // caller (so a caller told may start another job at once).
  using then_fn = absl::AnyInvocable<void() &&>;
  // Runs job(OK) on a thread of its own; or job(why) here, at once, where
  // `most` run already (ResourceExhausted), after join (Cancelled), or where
  // no thread can be made (ResourceExhausted). Then what the job returned.
  void run(absl::AnyInvocable<then_fn(absl::Status) &&> job);
  // Waits for every job started.
  void join();

 private:
  struct running {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  const std::size_t most_;
  std::mutex mutex_;
  std::vector<running> running_;  // guarded by mutex_
  bool joined_ = false;           // guarded by mutex_
};

}  // namespace dlasync::remote_detail
