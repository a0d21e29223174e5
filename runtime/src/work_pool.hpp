// The runtime's workers (internal): where copies, staging gathers, deleters
// and completions run. Either threads of the runtime's own (an
// asio::thread_pool of runtime_options::worker_threads) or an executor the
// caller gave (runtime_options::worker_executor), such as a server's own
// thread pool; then the runtime starts no worker threads. Tasks are counted,
// so that shutdown can wait for them on either.
//
// Thread safety: all members are safe from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>

#include "absl/functional/any_invocable.h"
#include "asio/any_io_executor.hpp"
#include "asio/thread_pool.hpp"

namespace dlasync::detail {

class work_pool {
 public:
  using task = absl::AnyInvocable<void() &&>;

  // `threads` threads of its own.
  explicit work_pool(int threads);
  // The caller's executor.
  explicit work_pool(asio::any_io_executor executor);
  work_pool(const work_pool&) = delete;
  work_pool& operator=(const work_pool&) = delete;
  ~work_pool();

  // Runs `fn` on a worker, never inside this call.
  void post(task fn);

  // True on a thread that is running one of this pool's tasks.
  bool running_in_this_thread() const noexcept;

  // An executor whose posts are this pool's tasks (counted).
  asio::any_io_executor executor() const { return executor_; }

  // Waits until no task is queued or running (tasks may post more), then
  // stops the pool's own threads. Posting afterwards is an error.
  void drain();

 private:
  std::optional<asio::thread_pool> own_;
  asio::any_io_executor executor_;
  std::mutex mutex_;
  std::condition_variable idle_;
  std::uint64_t pending_ = 0;
};

}  // namespace dlasync::detail
