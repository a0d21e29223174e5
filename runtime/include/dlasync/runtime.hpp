// dlasync/runtime.hpp
//
// `dlasync::runtime` is what imports run on. It owns:
//   - an Asio `io_context` run by `executor_threads` threads: the default
//     executor for completion handlers that have none of their own, and a
//     place to `co_spawn` request handlers;
//   - a worker pool for copy work, separate so that copies never stall the
//     executor;
//   - a releaser thread, started by the first producer's deleter it is
//     handed, where copies' source deleters run, so that one that blocks
//     delays no import;
//   - the process topology and the device registry;
//   - the backends that serve the devices (the host, and CUDA GPUs, real or
//     simulated) with their in-order streams;
//   - the copy memory budget.
//
// Example:
//
//   auto rt = dlasync::runtime::create({.worker_threads = 4});
//   if (!rt.ok()) return rt.status();
//   asio::co_spawn((*rt)->get_executor(), handle_request(**rt), asio::detached);
//
// Shutdown (`shutdown()`, or the destructor): new imports are refused with
// Unavailable (not consumed), imports in flight are cancelled (Cancelled,
// consumed), and every accepted tensor's deleter has run before it
// returns (a deleter that never returns holds it for as long). Handlers not
// yet run on the runtime's own executor are destroyed without being called,
// and the tensors they held released, before it returns. Concurrent callers
// all return once it is done. It must not be called from one of the
// runtime's own threads, nor from a deleter.
//
// A handler that throws on the runtime's executor does not end the process:
// the exception goes to runtime_options::on_handler_exception (stderr by
// default), and the executor thread goes on.
//
// Several runtimes may live in one process; each has its own threads.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "asio/any_io_executor.hpp"
#include "dlasync/device.hpp"
#include "dlasync/device_buffer.hpp"
#include "dlasync/device_registry.hpp"

namespace dlasync {

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
  // Freed host copy buffers of 4 KiB or more are kept for reuse, up to
  // this many bytes, so that imports do not page-fault through fresh
  // memory, nor pay aligned_alloc and free for small copies. 0 keeps none.
  // Every value is valid.
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

// `dlasync::runtime_stats` is a snapshot of a runtime's counters, for a
// server to export: what is in flight and waiting, what completed as views,
// copies and failures, the bytes the copies moved on each transfer path, the
// staging chunks in use, and how long imports took. `runtime::stats()` takes
// it; `to_string` gives the text the examples print.
//
// Example, a metrics endpoint:
//
//   const dlasync::runtime_stats s = rt.stats();
//   export_gauge("dlasync_imports_in_flight", s.imports_in_flight);
//   export_counter("dlasync_bytes_pageable_to_gpu", s.bytes.pageable_to_gpu);
//   for (std::size_t k = 0; k < s.latency.buckets.size(); ++k)
//     export_bucket(dlasync::latency_histogram::upper_bound_us(k), s.latency.buckets[k]);
//
// What is counted: every import of a runtime that goes through
// import_dlpack, async_import_dlpack, import_view or a batch (each member
// counts as one import), from any thread, the Python module's included, and
// remote imports where they land through a local import (a GPU target).
// An import begins when its operation starts (validation included) and
// completes when its result is handed to its handler (posted to the
// handler's executor), or returned by import_view or the awaitable form;
// a batch member completes when its own result is in.
//
// Consistency. Each field is exact on its own: a counter read once, with
// every import that completed before stats() was called counted in it. The
// fields are read one after another, not atomically together, so an import
// that completes during the call may show in one field and not yet in
// another. The reads are ordered so that the sums never contradict each
// other: latency.count <= views + copies + failed (equal when nothing
// completes during the call), and imports_in_flight, the imports begun
// less those completed, never underflows. bytes and the outcome counts may
// differ by the copies completing during the call.
//
// Cost: the counters are atomics on cache lines of their own, bumped
// relaxed (the completion counts with release, which is what orders the
// reads above; on x86 the same instruction). An import that completes inside
// the call without copying (a view, a refusal) adds one atomic increment; one
// that copies or waits adds three to five. None takes a lock or allocates
// for them. An import that copies or waits also reads the clock twice; one
// that completes inside the call does not, as the two reads would cost
// about as much as the view itself. stats() takes no lock.

// Bytes the completed copies moved, by transfer path (docs/cuda.md
// describes the paths). A copy counts its whole size once it has
// succeeded; a failed or cancelled copy counts nothing. Views move no bytes.
struct transfer_bytes {
  std::uint64_t host_to_host = 0;     // host strided copies, the inline ones included
  std::uint64_t pinned_to_gpu = 0;    // compact page-locked memory, one copy each
  std::uint64_t pageable_to_gpu = 0;  // other host memory, through the staging chunks
  std::uint64_t gpu_to_host = 0;      // GPU or managed memory down through the staging chunks
  std::uint64_t within_gpu = 0;       // on one GPU (the gather kernel when strided)
  std::uint64_t gpu_to_gpu = 0;       // to another GPU (peer copies)
};

// Completion latencies of imports, in log2 buckets of microseconds.
struct latency_histogram {
  static constexpr std::size_t bucket_count = 32;

  // The exclusive upper bound of bucket k, in microseconds: buckets[0]
  // counts imports under 1 us, buckets[k] those of at least 2^(k-1) and
  // under 2^k us; the last bucket also counts everything longer (2^31 us is
  // about 36 minutes).
  static constexpr std::uint64_t upper_bound_us(std::size_t k) noexcept {
    return std::uint64_t{1} << k;
  }

  std::array<std::uint64_t, bucket_count> buckets{};
  // The sum of the buckets: the imports completed.
  std::uint64_t count = 0;
};

// A runtime's counters; `runtime::stats()` takes it (see above for what
// "consistent" means). Counts are since the runtime was created.
struct runtime_stats {
  // Imports begun and not yet completed: validating, waiting for budget or
  // staging chunks, copying. Unlike runtime::in_flight(), which counts the
  // operations shutdown must cancel or wait for, it counts every import,
  // views included.
  std::uint64_t imports_in_flight = 0;
  // Requests for copy memory budget waiting in line (memory_budget::waiting):
  // one per import, one per batch for its members' copies together.
  std::uint64_t imports_waiting_for_budget = 0;
  // Imports completed: zero-copy views (those that waited for their
  // producer's stream included), copies, and failures of every kind
  // (refusals that left the tensor with its owner, cancellations, errors).
  std::uint64_t views = 0;
  std::uint64_t copies = 0;
  std::uint64_t failed = 0;
  transfer_bytes bytes;
  // Pinned staging chunks taken from the pool by uploads and downloads, and
  // the pool's size (runtime_options::staging_chunks); both 0 without a
  // CUDA backend.
  std::uint64_t staging_chunks_in_use = 0;
  std::uint64_t staging_chunks = 0;
  // From the start of each import's copy or wait to its completion. Imports
  // that complete inside the call without copying (views, refusals) are
  // counted in buckets[0], under 1 us, without reading the clock.
  latency_histogram latency;
};

// Four lines of text, for logs and the examples:
//
//   imports: 0 in flight, 0 waiting for budget; 120 views, 380 copies, 2 failed
//   bytes: host_to_host 1048576, pinned_to_gpu 0, pageable_to_gpu 67108864, ...
//   staging chunks: 0 of 8 in use
//   latency (502 imports): <1us 118, <2us 2, <256us 40, <512us 342
//
// The latency line names the buckets that are not empty, by upper bound.
std::string to_string(const runtime_stats& stats);

namespace detail {
class runtime_core;
struct runtime_access;
}  // namespace detail

class runtime {
 public:
  // The runtime's io_context's executor, or runtime_options::executor.
  using executor_type = asio::any_io_executor;

  // InvalidArgument for a bad option (naming it and the value seen) or a
  // malformed launcher environment; Unavailable for cuda = "real" without
  // a usable GPU.
  static absl::StatusOr<std::unique_ptr<runtime>> create(runtime_options options = {});

  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;
  ~runtime();

  executor_type get_executor() noexcept;
  const device_registry& registry() const noexcept;
  // The options as resolved: worker_threads, host_devices and cuda filled in.
  const runtime_options& options() const noexcept;

  // Allocates `bytes` of memory the caller owns, outside the copy budget:
  // host memory on cpu:N, device memory on cuda:N (usable on any stream
  // once this returns), page-locked host memory on cuda_host:0. The buffer
  // frees it when destroyed; the caller must make sure no device work still
  // uses it by then. Unimplemented for kinds no backend allocates here,
  // NotFound or FailedPrecondition for devices this process does not serve,
  // ResourceExhausted when memory runs out.
  absl::StatusOr<device_buffer> allocate(device d, std::uint64_t bytes);

  // What stands behind `d`: "host memory", the GPU's name ("NVIDIA H200"),
  // or "dlasync simulated GPU 0"; "unknown" for a device not served.
  std::string describe(device d) const;

  // True for the GPUs of a simulated CUDA runtime (cuda = "sim:N"), whose
  // device memory is host memory: work on them is never real GPU work.
  bool is_simulated(device d) const noexcept;

  // False once shutdown has begun.
  bool accepting() const noexcept;

  // Import operations in flight: those shutdown would cancel, and small host
  // copies under way on their callers' threads, which it waits for.
  std::size_t in_flight() const;

  // A snapshot of the import counters: in flight, waiting for budget,
  // views, copies and failures, bytes by transfer path, staging chunks in
  // use, completion latencies. Takes no lock; each field is exact on its
  // own, the fields are read one after another (runtime_stats.hpp says what
  // that promises).
  runtime_stats stats() const noexcept;

  // Exceptions that escaped handlers run on the runtime's executor
  // (reported through runtime_options::on_handler_exception).
  std::uint64_t handler_exceptions() const noexcept;

  // Stops accepting, cancels what is in flight and waits for it (see above).
  void shutdown();

 private:
  friend struct detail::runtime_access;
  explicit runtime(std::unique_ptr<detail::runtime_core> core) noexcept;

  std::unique_ptr<detail::runtime_core> core_;
};

}  // namespace dlasync
