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

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "asio/any_io_executor.hpp"
#include "dlasync/device.hpp"
#include "dlasync/device_buffer.hpp"
#include "dlasync/device_registry.hpp"
#include "dlasync/memory_budget.hpp"
#include "dlasync/runtime_options.hpp"
#include "dlasync/runtime_stats.hpp"

namespace dlasync {

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
  memory_budget& copy_budget() noexcept;

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

  // Import operations in flight, those shutdown would cancel.
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
