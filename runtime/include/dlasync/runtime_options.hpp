// dlasync/runtime_options.hpp
//
// `dlasync::runtime_options` configures a runtime: its threads, the devices
// it serves, its streams, the memory its copies may hold, and which CUDA
// runtime stands behind its GPUs (the real one, simulated GPUs, or none).
// `runtime::create` checks every field and refuses a bad one with
// InvalidArgument naming the field, the value seen and the range allowed.
//
// Example:
//
//   dlasync::runtime_options o;
//   o.worker_threads = 4;
//   o.copy_memory_budget = std::uint64_t{2} << 30;  // 2 GiB of copies at once
//   o.cuda = "sim:2";                              // two simulated GPUs
//   auto rt = dlasync::runtime::create(o);
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>

#include "asio/any_io_executor.hpp"

#include "dlasync/topology.hpp"

namespace dlasync {

// The simulated GPUs that `runtime_options::cuda = "sim:N"` gives, for
// machines without a GPU: device memory is host memory counted against a
// capacity, and copies take the time their bytes need at these rates. They
// are always reported as simulated ("dlasync simulated GPU 0").
struct simulated_gpu_options {
  // Device memory of each simulated GPU; more than 0.
  std::uint64_t memory_per_device = std::uint64_t{1} << 30;
  // Link rates in GB/s, each more than 0 and at most 1e6.
  double host_to_device_gbps = 25.0;
  double device_to_host_gbps = 25.0;
  double device_to_device_gbps = 400.0;
  // Freed device memory kept for reuse, up to this many bytes per GPU, so
  // that the host pages standing in for it stay resident as device memory
  // does (benchmarks set it). 0 frees at once, so that a sanitizer sees a
  // read after free.
  std::uint64_t device_reuse_bytes = 0;
};

struct runtime_options {
  // Threads running the runtime's io_context: [1, 1024]. Unused when
  // `executor` is given.
  int executor_threads = 1;
  // Copy workers: [0, 1024]; 0 means one per hardware thread. With a
  // `worker_executor`, no threads are started: this is then the number of
  // parts a large host copy is split into.
  int worker_threads = 0;

  // Embedding in a server that runs its own executors (docs/import.md).
  // `executor`: the executor of the caller's (a server's io_context, say)
  // that runtime::get_executor returns, on which handlers without an
  // executor of their own run. The runtime then starts no executor threads;
  // the caller runs that executor for as long as imports may complete, and
  // handlers that throw there reach the caller's run(), as Asio does.
  std::optional<asio::any_io_executor> executor;
  // `worker_executor`: where copies, staging gathers and the continuations
  // of GPU work run (a server's own thread pool, say). The runtime then
  // starts no worker threads; producers' deleters still run on its releaser
  // thread, never on this executor. It must run tasks concurrently
  // with the caller's threads, run them until shutdown() returns, and a
  // task posted to it must not wait for an import (shutdown waits for the
  // runtime's tasks on it).
  std::optional<asio::any_io_executor> worker_executor;
  // The process topology; empty means process_topology::from_environment().
  std::optional<process_topology> topology;
  // Virtual host devices (cpu:0..n-1): [0, 1024]; 0 means the topology's
  // count.
  int host_devices = 0;
  // In-order streams per device, taken by imports in turn: [1, 64].
  int streams_per_device = 2;
  // Bytes that copies may hold at once (until their tensors are released);
  // 0 means unlimited. Imports beyond it wait. Every value is valid.
  std::uint64_t copy_memory_budget = 0;
  // Host copies of at least this many bytes are split across the workers,
  // in parts of half of it at least (a part must outlast the wake-up of
  // the worker that takes it): at least 4096.
  std::uint64_t parallel_copy_bytes = 1 << 20;
  // Host-to-host copies of at most this many bytes run inside the call, on
  // the thread that starts the import, when the budget has room at once:
  // the hop to a worker and back costs more than such a copy gains. From
  // parallel_copy_bytes up, idle workers help (up to worker_threads threads
  // in all), claiming slices of it. The bound on how long the caller's
  // thread is held: this many bytes copied by that thread alone, plus one
  // slice (under 1 ms at 4 GB/s for the default 4 MiB; docs/performance.md
  // has the measurements). 0 sends every copy to the workers. At most
  // 64 MiB: a larger copy would hold the caller's thread for tens of
  // milliseconds.
  std::uint64_t inline_copy_bytes = 4 << 20;
  // How long a worker that helped with a split copy stays awake after it,
  // watching for the next one to help with, before it sleeps: [0, 10 ms].
  // Back-to-back copies of parallel_copy_bytes and more then find their
  // helpers running, instead of waiting for a thread wake-up each (tens of
  // microseconds, as long as such a copy takes). A lingering worker keeps
  // its core busy, yielding it to any thread that wants it; it leaves at
  // once when a task is queued for the workers.
  // 0 turns lingering off. Workers on a `worker_executor` never linger:
  // its threads run the caller's work too.
  std::chrono::microseconds copy_helper_linger{200};
  // Freed host copy buffers of 256 KiB or more are kept for reuse, up to
  // this many bytes, so that imports do not page-fault through fresh
  // memory. 0 keeps none. Every value is valid.
  std::uint64_t host_cache_bytes = std::uint64_t{1} << 30;

  // CUDA: "off", "auto" (real GPUs when present), "real", "sim" or "sim:N"
  // for N simulated GPUs (1 to 64). Empty means the DLASYNC_CUDA
  // environment variable, else "auto".
  std::string cuda;
  // What "sim" and "sim:N" simulate.
  simulated_gpu_options simulation;
  // Pinned staging for transfers between pageable host memory and GPUs:
  // the size of a chunk, [4096, 1 GiB]; the chunks shared by all imports,
  // [1, 1024]; and the streams per GPU that carry chunks, [1, 64].
  std::uint64_t staging_chunk_bytes = 4 << 20;
  int staging_chunks = 8;
  int staging_streams = 2;

  // Called on the executor thread when a handler running on the runtime's
  // executor throws; the thread then goes on running the other handlers.
  // Empty: the exception's what() is printed to stderr. It must not throw.
  // (On an executor of the caller's own, the exception reaches the
  // caller's run(), as Asio does.)
  std::function<void(std::exception_ptr)> on_handler_exception;
};

}  // namespace dlasync
