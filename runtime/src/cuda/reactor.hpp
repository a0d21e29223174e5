// The CUDA reactor (internal): one thread that polls the events it watches
// and calls each one's callback when its event completes. It spins briefly
// while events are pending, then naps; it sleeps when nothing is watched.
// Callbacks run on the reactor thread, one after the other, and must only
// hand off (cuda_context posts what follows to the runtime's workers,
// runtime/src/handoff.hpp): a slow callback would stall every GPU.
//
// Thread safety: `watch` and `quiesce` are safe from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "runtime/src/cuda/cuda_api.hpp"

namespace dlasync::detail {

class reactor {
 public:
  // The callback of a watched event owns it once called (and gives it back
  // to its pool).
  explicit reactor(cuda::api& api);
  reactor(const reactor&) = delete;
  reactor& operator=(const reactor&) = delete;
  // Stops the thread; events still watched are not waited for (the runtime
  // has ended every import by then).
  ~reactor();

  // Calls `done(status)` on the reactor thread when `e`, an event of
  // `device`, completes: OK, or the error of a query that kept failing.
  void watch(int device, cuda::event_t e, std::function<void(absl::Status)> done);

  // Returns once the reactor has finished the round of callbacks it was in
  // at the time of the call (at once when it was between rounds, or when
  // called from a callback).
  void quiesce();

  bool on_reactor_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  struct watched {
    int device;
    cuda::event_t event;
    std::function<void(absl::Status)> done;
    cuda::error first_error = cuda::error::success;  // a failed query, kept for the end
    int failures = 0;                                // failed queries in a row
  };

  void poll();

  cuda::api& api_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<watched> watched_;
  bool stop_ = false;
  // Rounds of polling and callbacks, for quiesce().
  std::uint64_t rounds_started_ = 0;
  std::uint64_t rounds_finished_ = 0;
  std::condition_variable round_done_;
  std::thread thread_;
};

}  // namespace dlasync::detail
