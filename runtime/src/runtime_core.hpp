// The runtime's core (internal): everything a `dlasync::runtime` owns, for
// the transfer layer and the tests to reach. The public class is a facade
// over it (dlasync/runtime.hpp says what it promises).
//
// It owns, in the order they are built: the options, the releaser that
// runs producers' deleters, the copy budget, the worker pool, the host
// backend, the CUDA backend when there is one, the device registry, the
// io_context and its threads. Imports register as operations so that
// shutdown can cancel them and wait for them.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "asio/executor_work_guard.hpp"
#include "asio/io_context.hpp"
#include "dlasync/memory_budget.hpp"
#include "dlasync/runtime.hpp"
#include "runtime/src/backend.hpp"
#include "runtime/src/cuda/cuda_api.hpp"
#include "runtime/src/cuda/cuda_backend.hpp"
#include "runtime/src/handoff.hpp"
#include "runtime/src/host/host_backend.hpp"
#include "runtime/src/releaser.hpp"
#include "runtime/src/runtime_counters.hpp"
#include "runtime/src/work_pool.hpp"

namespace dlasync::detail {

// What tests put into a runtime beyond its options: a configured CUDA
// runtime (a simulation with faults armed, say) instead of the one the
// options name, and a call after each piece of a host copy.
struct runtime_hooks {
  std::shared_ptr<cuda::api> cuda_api;
  std::function<void()> copy_unit_observer;
};

class runtime_core {
 public:
  // `options` must have passed check_options; the topology, worker count,
  // host devices and CUDA mode resolved.
  static absl::StatusOr<std::unique_ptr<runtime_core>> create(runtime_options options,
                                                              const process_topology& topology,
                                                              runtime_hooks hooks);
  runtime_core(const runtime_core&) = delete;
  runtime_core& operator=(const runtime_core&) = delete;
  ~runtime_core();

  const runtime_options& options() const noexcept { return options_; }
  const runtime_hooks& hooks() const noexcept { return hooks_; }
  const device_registry& registry() const noexcept { return *registry_; }
  const std::shared_ptr<memory_budget>& budget() const noexcept { return budget_; }
  asio::io_context& io() noexcept { return io_; }
  // The executor handlers without one of their own run on: the caller's
  // (runtime_options::executor) or the io_context's.
  const asio::any_io_executor& executor() const noexcept { return executor_; }
  work_pool& workers() noexcept { return *workers_; }
  // Where a copy's source deleter runs once nothing reads the source: a
  // thread of its own, so that a producer's deleter that blocks delays no
  // import. Drained by shutdown, after the imports and before the threads
  // stop.
  releaser& releases() noexcept { return releases_; }
  // Where completions that arrive on the CUDA reactor, and budget grants
  // that arrive on a thread dropping a tensor, continue: the workers, until
  // shutdown stops them.
  handoff& completions() noexcept { return *completions_; }
  // What the imports count (runtime::stats).
  runtime_counters& counters() noexcept { return counters_; }
  runtime_stats stats() const noexcept;
  // Exceptions that escaped handlers on the runtime's executor.
  std::uint64_t handler_exceptions() const noexcept {
    return handler_exceptions_.load(std::memory_order_relaxed);
  }

  host_backend& host() noexcept { return *host_; }
  // The CUDA backend, or nullptr when this runtime has none.
  cuda_backend* cuda() noexcept { return cuda_.get(); }
  // The CUDA runtime behind it (real or simulated), or nullptr.
  cuda::api* cuda_api() noexcept { return cuda_api_.get(); }

  // The backend that serves `kind`, as the backends announced at start (the
  // registry's entries); nullptr when none does.
  backend* backend_for(device_kind kind) noexcept;

  // The next stream of `d`, round robin over streams_per_device.
  stream_slot next_stream(device d) noexcept;

  // False once shutdown has begun.
  bool accepting() const noexcept { return accepting_.load(std::memory_order_acquire); }
  std::size_t in_flight() const;

  // Registers an import that `cancel` stops. Returns 0 when the runtime no
  // longer accepts work; else an id for `end_operation`.
  std::uint64_t begin_operation(std::function<void()> cancel);
  void end_operation(std::uint64_t id);

  // An operation that runs to its end on the calling thread, with nothing
  // to cancel (an inline host copy): counted, not registered, so that it
  // costs two atomic instructions where begin_operation takes a lock and a
  // map entry. False when the runtime no longer accepts work. Shutdown
  // waits until every one begun has ended.
  bool begin_inline() noexcept {
    // Both sides sequentially consistent: either this load sees shutdown's
    // store, or shutdown's read of the count sees this increment.
    inline_ops_.fetch_add(1, std::memory_order_seq_cst);
    if (accepting_.load(std::memory_order_seq_cst)) return true;
    end_inline();
    return false;
  }
  void end_inline() noexcept {
    if (inline_ops_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        !accepting_.load(std::memory_order_seq_cst)) {
      inline_ops_.notify_all();
    }
  }

  // Stops accepting, cancels what is in flight, waits for it and for every
  // deleter handed to the releaser, stops the threads and destroys the
  // handlers still queued on the executor (their tensors released). Every
  // caller returns once that is done.
  void shutdown();

 private:
  // The io_context, with its services' shutdown (which destroys the
  // handlers it still holds) callable before its destruction.
  class owned_io : public asio::io_context {
   public:
    using asio::io_context::shutdown;
  };

  runtime_core(runtime_options options, runtime_hooks hooks);
  absl::Status start(const process_topology& topology);
  // One executor thread: runs the io_context, and goes on after a handler
  // throws (runtime_options::on_handler_exception).
  void run_executor();

  runtime_options options_;
  runtime_hooks hooks_;
  // Before everything that hands it deleters, so that it outlives them.
  releaser releases_;
  std::shared_ptr<memory_budget> budget_;
  std::unique_ptr<work_pool> workers_;
  std::unique_ptr<host_backend> host_;
  std::shared_ptr<cuda::api> cuda_api_;
  std::unique_ptr<cuda_backend> cuda_;
  // backend_for, indexed by DLPack's device-type code.
  std::array<backend*, 32> by_kind_{};
  std::optional<device_registry> registry_;
  std::shared_ptr<handoff> completions_ = std::make_shared<handoff>();
  owned_io io_;
  asio::any_io_executor executor_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::vector<std::thread> executor_threads_;
  std::unique_ptr<std::atomic<std::uint32_t>[]> next_stream_;

  std::atomic<bool> accepting_{true};
  std::atomic<std::int64_t> inline_ops_{0};  // begin_inline's count
  mutable std::mutex ops_mutex_;
  std::condition_variable ops_done_;
  std::uint64_t next_op_ = 1;
  absl::flat_hash_map<std::uint64_t, std::function<void()>> ops_;
  bool shut_down_ = false;      // shutdown has begun
  bool shutdown_done_ = false;  // and finished
  std::condition_variable shutdown_finished_;
  std::atomic<std::uint64_t> handler_exceptions_{0};
  runtime_counters counters_;
  // The staging chunk pool's count of chunks in use, and its size; 0
  // without a CUDA backend.
  std::shared_ptr<std::atomic<int>> chunks_in_use_ = std::make_shared<std::atomic<int>>(0);
  std::uint64_t staging_chunks_ = 0;
};

// The core of `rt`.
struct runtime_access {
  static runtime_core& core(runtime& rt) noexcept { return *rt.core_; }
  static const runtime_core& core(const runtime& rt) noexcept { return *rt.core_; }
  static std::unique_ptr<runtime> wrap(std::unique_ptr<runtime_core> core) {
    return std::unique_ptr<runtime>(new runtime(std::move(core)));
  }
};

inline runtime_core& core_of(runtime& rt) noexcept {
  return runtime_access::core(rt);
}

// runtime::create with `hooks` (tests): the same checks and resolution.
absl::StatusOr<std::unique_ptr<runtime>> create_runtime(runtime_options options,
                                                        runtime_hooks hooks);

// InvalidArgument naming the first field of `options` out of range.
absl::Status check_options(const runtime_options& options);

}  // namespace dlasync::detail
