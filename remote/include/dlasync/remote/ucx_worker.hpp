// dlasync/remote/ucx_worker.hpp
//
// `dlasync::ucx_worker` is one UCX context and worker driven from an Asio
// executor: what a remote_node runs on, and what a program that speaks its
// own UCX protocol beside dlasync can use (the inference-server example's
// UCX transport does). It owns the UCX context (RMA, active messages,
// wakeup) and its worker, created in UCS_THREAD_MODE_SERIALIZED: every UCX
// call on them must hold `mutex()`, and UCX's callbacks (request
// completions, active messages, endpoint errors) run inside `progress()`,
// so they hold it too. Progress is driven by the worker's event file
// descriptor, watched by an `asio::posix::stream_descriptor` on the
// executor: when it is readable, the worker is progressed until idle and
// re-armed (ucp_worker_arm); nothing spins. Code that starts UCX operations
// calls `progress()` afterwards, as UCX asks before sleeping on the
// descriptor again.
//
// Example:
//
//   auto w = dlasync::ucx_worker::create(rt->get_executor(), "tcp");
//   { std::lock_guard lock((*w)->mutex()); (*w)->set_am_handler(id, &on_message, this); }
//   (*w)->start();
//   ...
//   { std::lock_guard lock((*w)->mutex()); (*w)->finalize(); }
//
// Thread safety: the members hold or require the mutex as each says.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include <ucp/api/ucp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "asio/any_io_executor.hpp"
#include "asio/posix/stream_descriptor.hpp"

namespace dlasync {

class ucx_worker : public std::enable_shared_from_this<ucx_worker> {
 public:
  // `transports`: UCX_TLS's syntax, or empty for UCX's choice.
  static absl::StatusOr<std::shared_ptr<ucx_worker>> create(const asio::any_io_executor& executor,
                                                            const std::string& transports);
  ucx_worker(const ucx_worker&) = delete;
  ucx_worker& operator=(const ucx_worker&) = delete;
  // Requires stop() first. The watch holds only a weak reference, so the
  // last owner may be the executor's thread that ran it.
  ~ucx_worker();

  std::mutex& mutex() noexcept { return mutex_; }
  ucp_context_h context() const noexcept { return context_; }
  ucp_worker_h worker() const noexcept { return worker_; }
  // The worker's address, packed (ucp_worker_get_address).
  const std::string& address() const noexcept { return address_; }
  // Whether this UCX can register CUDA device memory.
  bool cuda_memory() const noexcept { return cuda_memory_; }
  // The transports UCX uses here (ucp_worker_print_info's list).
  std::string transports() const;

  // Registers `cb` (with `arg`) for the active messages `id`, delivered
  // whole (UCP_AM_FLAG_WHOLE_MSG). Requires the mutex. Internal when UCX
  // refuses, naming its status.
  absl::Status set_am_handler(unsigned id, ucp_am_recv_callback_t cb, void* arg);

  // Starts watching the event descriptor. Call once, without the mutex.
  void start();
  // Progresses until idle. Requires the mutex; from inside a UCX callback
  // it does nothing (the progress under way goes on until idle).
  void progress();
  // Stops watching; requires the mutex.
  void stop();
  // Stops, then destroys the worker and the context, so that peers see the
  // connection go; requires the mutex. Nothing may call UCX afterwards.
  void finalize();
  bool finalized() const noexcept { return worker_ == nullptr; }

 private:
  ucx_worker() = default;
  void watch();
  // From the wait's completion, or from a look that found the descriptor
  // readable (watch).
  void on_readable(bool from_wait, const asio::error_code& ec);

  std::mutex mutex_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  bool cuda_memory_ = false;
  bool stopped_ = false;
  bool progressing_ = false;
  bool waiting_ = false;  // an async_wait is pending
  std::unique_ptr<asio::posix::stream_descriptor> events_;
};

}  // namespace dlasync
