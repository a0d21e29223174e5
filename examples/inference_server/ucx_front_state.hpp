// The UCX transport's state (ucx_front.hpp), shared by its two files:
// ucx_front.cpp (the listener, connections, stop) and ucx_requests.cpp (a
// request from its message to its answer). Not for other users.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ucp/api/ucp.h>

#include "asio/steady_timer.hpp"
#include "remote/src/ucx_worker.hpp"
#include "ucx_front.hpp"

namespace dlasync::examples {
namespace ucx_detail {

struct connection {
  ucp_ep_h ep = nullptr;
  std::string peer;  // the numeric address it came from; empty if unknown
  bool alive = true;
  std::optional<connection_limit::slot> slot;
  // Its requests waiting for room in the budget, and the bytes they hold.
  std::size_t queued = 0;
  std::uint64_t queued_bytes = 0;
};

// A request from its arrival until its handler starts or it is dropped:
// its tag, its data (copied when it came eagerly, UCX's descriptor when it
// comes by rendezvous), and while a rendezvous body arrives, the body and the
// receive's deadline. Guarded by the worker's mutex.
struct ucx_request {
  ucx_front::state* owner = nullptr;
  std::shared_ptr<connection> conn;
  std::uint64_t tag = 0;
  std::uint32_t length = 0;
  std::vector<std::byte> eager;
  void* rendezvous = nullptr;  // until received or released
  std::uint64_t ticket = 0;    // the budget's, while queued
  std::uint64_t held = 0;      // eager bytes, counted while queued
  bool queued = false;
  bool receiving = false;
  ucx_front::message body;
  std::unique_ptr<asio::steady_timer> deadline;
};

}  // namespace ucx_detail

using ucx_detail::connection;
using ucx_detail::ucx_request;

struct ucx_front::state : std::enable_shared_from_this<ucx_front::state> {
  asio::any_io_executor executor;
  options opts;
  std::shared_ptr<memory_budget> budget;
  handler_fn handle;
  counter_fn count;
  std::shared_ptr<ucx_worker> ucx;
  unsigned short port = 0;
  // stopping: no new request is taken; stopped: UCX is gone.
  bool stopping = false;
  bool stopped = false;
  std::unordered_map<ucp_ep_h, std::shared_ptr<connection>> connections;
  // Requests between their message and their handler (or their drop).
  std::unordered_map<const ucx_request*, std::shared_ptr<ucx_request>> requests;
  std::atomic<std::uint64_t> accepted{0};
  std::atomic<std::uint64_t> refused_connections{0};
  std::atomic<std::uint64_t> bytes_in{0};
  std::atomic<std::uint64_t> refused_queue{0};
  std::atomic<std::uint64_t> closed_late{0};
  // Handlers running; stop() waits for them.
  std::mutex running_mutex;
  std::condition_variable running_done;
  int running = 0;

  static void on_connection(ucp_conn_request_h request, void* arg);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_request(void* arg, const void* header, std::size_t header_length,
                                 void* data, std::size_t length, const ucp_am_recv_param_t* param);

  // The members below require the worker's mutex.

  // Sends the answer to the request `tag` to the connection, when it is
  // still there: the serialized response, or the error's message.
  void reply_locked(connection& c, std::uint64_t tag, absl::StatusOr<std::string> answer);

  ucs_status_t admit(const std::shared_ptr<connection>& c, std::uint64_t tag, std::uint32_t total,
                     void* data, std::size_t length, bool rendezvous);
  void granted(const std::shared_ptr<ucx_request>& r, const absl::Status& status);
  void receive(const std::shared_ptr<ucx_request>& r);
  void received(ucx_request* r, ucs_status_t status);
  void past_deadline(const std::shared_ptr<ucx_request>& r);
  // Ends the connection: its queued requests leave the budget's line, its
  // endpoint is closed (which ends its receives). `from_ucx`: inside UCX's
  // callback, where the endpoint may not be closed.
  void close_connection(const std::shared_ptr<connection>& c, bool from_ucx);
  void leave_queue(ucx_request& r);
  void release_rendezvous(ucx_request& r);
  std::shared_ptr<ucx_request> forget(ucx_request* r);
  void run_handler(const std::shared_ptr<connection>& c, std::uint64_t tag,
                   ucx_front::message body);
};

}  // namespace dlasync::examples
