// dlasync/runtime/runtime.hpp
//
// `dlasync::runtime` is what imports run on. It owns:
//   - an Asio `io_context` run by `executor_threads` threads: the default
//     executor for completion handlers that have none of their own, and a
//     place to `co_spawn` request handlers;
//   - a worker pool for copy work, separate so that copies never stall the
//     executor;
//   - the process topology and the device registry;
//   - the backends and their in-order streams, `streams_per_device` per device;
//   - the copy memory budget.
//
// Example:
//
//   auto rt = dlasync::runtime::create({.worker_threads = 4});
//   if (!rt.ok()) return rt.status();
//   asio::co_spawn((*rt)->get_executor(), handle_request(**rt), asio::detached);
//
// Shutdown (`shutdown()`, or the destructor): new imports are refused with
// Unavailable, imports in flight are cancelled, and every accepted tensor's
// deleter has run before it returns. Handlers not yet run on the runtime's
// own executor are destroyed without being called. It must not be called
// from one of the runtime's own threads.
//
// Several runtimes may live in one process; each has its own threads.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "asio/io_context.hpp"
#include "asio/thread_pool.hpp"
#include "dlasync/runtime/backend.hpp"
#include "dlasync/runtime/cuda_api.hpp"
#include "dlasync/runtime/device_registry.hpp"
#include "dlasync/runtime/memory_budget.hpp"
#include "dlasync/runtime/topology.hpp"

namespace dlasync {

struct runtime_options {
  // Threads running the runtime's io_context.
  int executor_threads = 1;
  // Copy workers; 0 means one per hardware thread.
  int worker_threads = 0;
  // The process topology; empty means process_topology::from_environment().
  std::optional<process_topology> topology;
  // Virtual host devices (cpu:0..n-1); 0 means the topology's count.
  int host_devices = 0;
  // In-order streams per device; imports take them in turn.
  int streams_per_device = 2;
  // Bytes that copies may hold at once (until their tensors are released);
  // 0 means unlimited. Imports beyond it wait.
  std::uint64_t copy_memory_budget = 0;
  // Host copies of at least this many bytes are split across the workers,
  // in parts of half of it at least (a part must outlast the wake-up of
  // the worker that takes it).
  std::uint64_t parallel_copy_bytes = 1 << 20;
  // Host-to-host copies of at most this many bytes run on the thread that
  // starts the import, inside the call, when the budget has room at once:
  // such a copy takes less time than the hop to a worker and back. 0 sends
  // every copy to the workers.
  std::uint64_t inline_copy_bytes = 64 << 10;
  // Freed host copy buffers of 256 KiB or more are kept for reuse, up to
  // this many bytes, so that imports do not page-fault through fresh memory.
  std::uint64_t host_cache_bytes = std::uint64_t{1} << 30;
  // Instrumentation: called by copy workers after each piece of a copy.
  std::function<void()> copy_unit_observer;

  // CUDA: "off", "auto" (real GPUs when present), "real", or "sim:N" for N
  // simulated GPUs. Empty means the DLASYNC_CUDA environment variable, else
  // "auto". `cuda_api`, when set, is used instead (a configured simulation).
  std::string cuda;
  std::shared_ptr<cuda::api> cuda_api;
  // Pinned staging for transfers between pageable host memory and GPUs:
  // chunk size, chunk count (shared by all imports), streams per device.
  std::uint64_t staging_chunk_bytes = 4 << 20;
  int staging_chunks = 8;
  int staging_streams = 2;
};

class runtime {
 public:
  using executor_type = asio::io_context::executor_type;

  // InvalidArgument for bad options or a malformed launcher environment.
  static absl::StatusOr<std::unique_ptr<runtime>> create(runtime_options options = {});

  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;
  ~runtime();

  executor_type get_executor() noexcept { return io_.get_executor(); }
  const device_registry& registry() const noexcept { return *registry_; }
  const runtime_options& options() const noexcept { return options_; }
  memory_budget& copy_budget() noexcept { return *budget_; }
  const std::shared_ptr<memory_budget>& copy_budget_ptr() const noexcept { return budget_; }

  // The backend serving `d`'s kind; the device must be in the registry.
  backend& backend_for(device d) noexcept;

  // The backend that can follow a producer's stream in memory of `d`: the
  // CUDA backend for GPU, managed and pinned memory when there is one, else
  // backend_for(d).
  backend& stream_backend(device d) noexcept;

  // The backend that copies from `source` to `target`: the CUDA backend when
  // either is a GPU, else the host backend.
  backend& copy_backend(device source, device target) noexcept;

  // The device whose streams carry a copy from `source` to `target`.
  static device copy_device(device source, device target) noexcept;

  // The next stream of `d`, round robin.
  stream_ref next_stream(device d) noexcept;

  // The CUDA runtime behind the CUDA backend (real or simulated), or
  // nullptr when this runtime has no CUDA backend.
  cuda::api* cuda() noexcept { return cuda_api_.get(); }

  // OK when `pointer` lies in memory of `claimed` as far as the backends can
  // tell: FailedPrecondition naming both devices when it lies elsewhere.
  absl::Status check_location(const void* pointer, device claimed) const;

  // False once shutdown has begun.
  bool accepting() const noexcept { return accepting_.load(std::memory_order_acquire); }

  // Imports in flight.
  std::size_t in_flight() const;

  // Stops accepting, cancels what is in flight and waits for it (see above).
  void shutdown();

  // For imports: registers an operation that `cancel` stops. Returns 0 when
  // the runtime no longer accepts work; else an id for `end_operation`.
  std::uint64_t begin_operation(std::function<void()> cancel);
  void end_operation(std::uint64_t id);

 private:
  explicit runtime(runtime_options options);
  absl::Status start(const process_topology& topology);

  runtime_options options_;
  std::optional<device_registry> registry_;
  std::shared_ptr<memory_budget> budget_;
  asio::io_context io_;
  std::optional<asio::executor_work_guard<executor_type>> work_;
  std::vector<std::thread> executor_threads_;
  asio::thread_pool workers_;
  std::unique_ptr<backend> host_;
  std::shared_ptr<cuda::api> cuda_api_;
  std::unique_ptr<backend> cuda_;
  int cuda_devices_ = 0;
  std::unique_ptr<std::atomic<std::uint32_t>[]> next_stream_;

  std::atomic<bool> accepting_{true};
  mutable std::mutex ops_mutex_;
  std::condition_variable ops_done_;
  std::uint64_t next_op_ = 1;
  absl::flat_hash_map<std::uint64_t, std::function<void()>> ops_;
  bool shut_down_ = false;
};

}  // namespace dlasync
