// remote/src/ucx_worker.hpp
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

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "asio/any_io_executor.hpp"
#include "asio/posix/stream_descriptor.hpp"

namespace dlasync {

// What a ucx_worker's UCX context offers beyond active messages.
struct ucx_features {
  // UCP_FEATURE_RMA. UCX then lets every connected peer read and write any
  // memory of this process through its software RMA (over TCP, and over any
  // transport with active messages), registered or not: only for peers
  // trusted with the whole process.
  bool rma = false;
};

class ucx_worker : public std::enable_shared_from_this<ucx_worker> {
 public:
  using features = ucx_features;
  // `transports`: UCX_TLS's syntax, or empty for UCX's choice. A list of
  // shared-memory transports only (shm, sm, posix, sysv, cma, knem, xpmem,
  // self) gets tcp added for UCX's connection manager (listen, connect),
  // and its endpoints go without peer error handling, which UCX 1.13's
  // shared-memory transports lack.
  static absl::StatusOr<std::shared_ptr<ucx_worker>> create(const asio::any_io_executor& executor,
                                                            const std::string& transports,
                                                            features f = {});
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
  // Whether UCP_FEATURE_RMA is on (features::rma).
  bool rma() const noexcept { return rma_; }
  // Whether endpoints ask UCX for peer error handling (a lost peer is
  // reported): not for shared-memory-only transport lists.
  bool peer_failure() const noexcept { return peer_failure_; }

  // Connections through UCX's TCP connection manager: an address and a
  // port to listen on or connect to, never a peer's packed worker address
  // (UCX's parsers of those are not made for hostile bytes). The peer's
  // endpoint is `ep` in an active message's reply_ep when it was sent with
  // UCP_AM_SEND_FLAG_REPLY. Errors on an endpoint go to `on_error` with
  // `arg`, when set. All require the mutex.
  //
  // Listens on `address` (numeric IPv4 or IPv6) and `port` (0: a free one);
  // each connection request goes to `on_request`, which accepts (accept)
  // or rejects (reject) it. Returns the port. InvalidArgument for an
  // address that is not numeric, Unavailable when UCX cannot listen there;
  // FailedPrecondition when this worker listens already.
  absl::StatusOr<std::uint16_t> listen(const std::string& address, std::uint16_t port,
                                       ucp_listener_conn_callback_t on_request, void* arg);
  absl::StatusOr<ucp_ep_h> accept(ucp_conn_request_h request, ucp_err_handler_cb_t on_error,
                                  void* arg);
  void reject(ucp_conn_request_h request);
  // No connection requests from here on (finalize does it too).
  void stop_listening();
  // An endpoint to the listener at `address`:`port`. InvalidArgument for an
  // address that is not numeric or port 0; Unavailable when UCX cannot
  // start the connection (a refused one is reported later, to on_error).
  absl::StatusOr<ucp_ep_h> connect(const std::string& address, std::uint16_t port,
                                   ucp_err_handler_cb_t on_error, void* arg);
  // The transports UCX uses here (ucp_worker_print_info's list).
  std::string transports() const;

  // Active-message ids are 16 bits on UCX's wire. Every one of them has a
  // handler from the start: the worker's own, which drops the message (and
  // counts it), until set_am_handler claims the id. So a peer's message
  // never reaches a slot of UCX's table that nobody set.
  static constexpr unsigned max_am_ids = 1U << 16;

  // Registers `cb` (with `arg`) for the active messages `id`, delivered
  // whole (UCP_AM_FLAG_WHOLE_MSG). Requires the mutex. InvalidArgument for
  // an id of max_am_ids or more; Internal when UCX refuses, naming its
  // status.
  absl::Status set_am_handler(unsigned id, ucp_am_recv_callback_t cb, void* arg);
  // The endpoint to answer a received active message on: its reply
  // endpoint when sent with UCP_AM_SEND_FLAG_REPLY, else null.
  static ucp_ep_h reply_endpoint(const ucp_am_recv_param_t* param) noexcept {
    return (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  }
  // Messages dropped because no handler claimed their id. Requires the
  // mutex.
  std::uint64_t dropped_messages() const noexcept { return dropped_; }

  // An active message to send: the worker owns `bytes` until UCX is done
  // with them (UCX 1.13 reads a send's header and data until it completes).
  struct am_message {
    unsigned id = 0;
    // The header, then the data when `data` is null.
    std::vector<std::byte> bytes;
    std::size_t header_bytes = 0;  // at most bytes.size()
    // Data outside `bytes`, which the caller keeps readable until `done`
    // runs or finalize() returns; null: the bytes past the header.
    const void* data = nullptr;
    std::size_t data_bytes = 0;
    // UCP_AM_SEND_FLAG_REPLY: the receiver gets an endpoint to answer on.
    bool reply = false;
    // How UCX carries the data: its choice by size, or always eagerly (the
    // bytes go with the message, copied through UCX's buffers: no round
    // trip), or always by rendezvous (the receiver fetches them when it
    // takes the message: zero-copy where the transport can).
    enum class protocol : std::uint8_t { automatic, eager, rendezvous };
    protocol carried_by = protocol::automatic;
  };
  using send_done = absl::AnyInvocable<void(ucs_status_t)>;
  // Sends `m` on `ep`. `done` (may be empty) runs once when the send is
  // over: inside this call when it completes or fails at once, else from
  // progress() with UCX's status, or with UCS_ERR_CANCELED when `ep` is
  // closed (close_endpoint) before UCX completes it. A send still pending
  // when finalize() destroys the worker ends with it: its bytes are freed,
  // and `done` runs only if UCX completes the send as the worker goes.
  // Requires the mutex. Returns UCS_OK, UCS_INPROGRESS or UCX's error for
  // the start.
  ucs_status_t send_am(ucp_ep_h ep, am_message m, send_done done = nullptr);
  // Sends started here that UCX has not completed. Requires the mutex.
  std::size_t sends_pending() const noexcept { return sends_.size(); }
  // Closes `ep` at once (UCP_EP_CLOSE_FLAG_FORCE); its operations end with
  // errors. UCX 1.13 leaves a rendezvous already requested pending: when the
  // close completes, such a send's `done` runs with UCS_ERR_CANCELED (no
  // transfer can go on without the endpoint), and the worker keeps its
  // bytes until UCX lets go of the request or the worker ends. The worker
  // frees the close request when it completes. Requires the mutex.
  //
  // `flush`: the sends under way go out first (UCX's flush mode), as when
  // the peer is alive and only this side is going: UCX 1.13 aborts when a
  // worker is destroyed after a forced close of an endpoint whose connection
  // was still being made with a send queued on it. settle_closes bounds the
  // wait.
  void close_endpoint(ucp_ep_h ep, bool flush = false);
  // Progresses until the closes under way complete, at most 5 seconds (their
  // operations' callbacks run inside). Requires the mutex.
  void settle_closes();

  // Starts watching the event descriptor. Call once, without the mutex.
  void start();
  // Progresses until idle, or for at most max_progress_rounds rounds, when
  // the rest goes on from the executor (so a peer that never stops sending
  // cannot keep a thread and the lock for good). Requires the mutex; from
  // inside a UCX callback it does nothing (the progress under way goes on).
  void progress();
  static constexpr unsigned max_progress_rounds = 4096;
  // Stops watching; requires the mutex.
  void stop();
  // Stops, then destroys the worker and the context, so that peers see the
  // connection go; requires the mutex. First closes the endpoints that
  // still have sends under way and were not closed with close_endpoint
  // (reply endpoints, which UCX made), then settles the closes. Nothing may
  // call UCX afterwards.
  void finalize();
  bool finalized() const noexcept { return worker_ == nullptr; }

 private:
  ucx_worker() = default;
  static bool shared_memory_only(const std::string& transports);
  absl::Status claim_am_ids();
  static ucs_status_t on_unclaimed(void* arg, const void* header, std::size_t header_length,
                                   void* data, std::size_t length,
                                   const ucp_am_recv_param_t* param);
  void watch();
  // From the wait's completion, or from a look that found the descriptor
  // readable (watch).
  void on_readable(bool from_wait, const asio::error_code& ec);

  struct pending_send {
    ucx_worker* owner = nullptr;
    std::list<pending_send>::iterator self;
    ucp_ep_h ep = nullptr;  // null once close_endpoint closed it
    ucp_ep_h sent_on = nullptr;
    am_message message;
    send_done done;  // empty once it ran
  };
  struct closing {
    ucx_worker* owner = nullptr;
    ucp_ep_h ep = nullptr;
    void* request = nullptr;
  };
  // The close of `ep` completed: its sends UCX still holds are over.
  void closed(ucp_ep_h ep);
  // A send is over: its message is dropped, then its completion runs.
  void end_send(std::list<pending_send>::iterator sent, ucs_status_t status);

  std::mutex mutex_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  bool cuda_memory_ = false;
  bool rma_ = false;
  bool peer_failure_ = true;
  ucp_listener_h listener_ = nullptr;
  std::uint64_t dropped_ = 0;
  bool stopped_ = false;
  bool progressing_ = false;
  bool waiting_ = false;  // an async_wait is pending
  std::unique_ptr<asio::posix::stream_descriptor> events_;
  std::list<pending_send> sends_;  // sends UCX has not completed
  std::list<closing> closing_;     // endpoint closes not yet complete
};

}  // namespace dlasync
