// The runtime's workers (internal): where copies, staging gathers and
// completions run (never producers' deleters: runtime/src/releaser.hpp).
// Either threads of the runtime's own (an
// asio::thread_pool of runtime_options::worker_threads) or an executor the
// caller gave (runtime_options::worker_executor), such as a server's own
// thread pool; then the runtime starts no worker threads. Tasks are counted,
// so that shutdown can wait for them on either.
//
// Shared work: a thread that splits a job into parts offers it (offer()),
// and helpers claim parts beside it. A helper on the pool's own threads
// lingers after its job for runtime_options::copy_helper_linger, watching
// for the next offer, so that back-to-back jobs find their helpers awake
// instead of paying a thread wake-up each. A lingering worker leaves at
// once when a task is queued for the pool, or when the pool drains.
//
// Thread safety: all members are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/functional/any_invocable.h"
#include "asio/any_io_executor.hpp"
#include "asio/thread_pool.hpp"

namespace dlasync::detail {

// A job that several threads can work on at once: each help() claims and
// does parts until none is left, and returns. It may be called after the
// job finished, and then finds nothing to do.
class shared_job {
 public:
  virtual ~shared_job() = default;
  virtual void help() noexcept = 0;
};

class work_pool {
 public:
  using task = absl::AnyInvocable<void() &&>;

  // `threads` threads of its own; helpers linger for `linger` (0: never).
  work_pool(int threads, std::chrono::nanoseconds linger);
  // The caller's executor: its threads are not the pool's to hold, so no
  // helper lingers there.
  explicit work_pool(asio::any_io_executor executor);
  work_pool(const work_pool&) = delete;
  work_pool& operator=(const work_pool&) = delete;
  ~work_pool();

  // Runs `fn` on a worker, never inside this call.
  void post(task fn);

  // Offers `job` to `helpers` helpers: lingering workers take it at once,
  // and as many more as are still wanted are posted. One job is offered at
  // a time; while another is, all `helpers` are posted. The caller works
  // on the job too, and withdraws it when done. Returns the helpers posted.
  int offer(const std::shared_ptr<shared_job>& job, int helpers);
  // Takes `job` off offer (no-op when it is not the one offered).
  void withdraw(const shared_job* job);

  // Workers lingering now, idle and watching for an offer.
  int lingering() const noexcept { return lingering_.load(std::memory_order_relaxed); }

  // True on a thread that is running one of this pool's tasks.
  bool running_in_this_thread() const noexcept;

  // Waits until no task is queued or running (tasks may post more), then
  // stops the pool's own threads. Posting afterwards is an error.
  void drain();

 private:
  // Helps `job`, then lingers for the next offer.
  void help_and_linger(const std::shared_ptr<shared_job>& job);
  std::shared_ptr<shared_job> offered();

  std::optional<asio::thread_pool> own_;
  asio::any_io_executor executor_;
  const std::chrono::nanoseconds linger_{0};
  std::mutex mutex_;
  std::condition_variable idle_;
  std::uint64_t pending_ = 0;
  // Tasks posted and not yet started: a lingering worker makes way.
  std::atomic<std::int64_t> queued_{0};
  std::atomic<bool> draining_{false};
  // The job on offer (under offer_mutex_), and a count of offers made, which
  // lingering workers watch.
  std::mutex offer_mutex_;
  std::shared_ptr<shared_job> offered_;
  std::atomic<std::uint64_t> offers_{0};
  std::atomic<int> lingering_{0};
};

}  // namespace dlasync::detail
