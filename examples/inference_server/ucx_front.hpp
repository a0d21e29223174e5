// The inference server's UCX transport: the Open Inference Protocol's
// ModelInferRequest and ModelInferResponse messages, as UCX active messages
// (ucx_protocol.hpp has the bytes on the wire). The gRPC front carries the
// same messages, and one handler answers both.
//
// A client connects to the server's UCX listener (`--ucx_port`) and sends
// each request as one active message with UCP_AM_SEND_FLAG_REPLY: a 16-byte
// header (magic, tag) and the serialized request as its data, which UCX
// carries eagerly when small and by rendezvous when large. The server checks
// the header and the data's length (against --max_request_mib and the budgets)
// before it takes any of the data: a rendezvous payload is received straight
// into a buffer granted by the server's memory budget, once granted. The
// message then goes to the handler, and its answer returns as an active
// message (id `ucx_response_am`) with the request's tag.
//
// A UCX message cannot lose its framing, so a malformed request (a header of
// the wrong size or magic, data that is no ModelInferRequest) is answered
// with InvalidArgument and the connection goes on.
//
// What a peer cannot do:
//   - hold more than `options::connections` allows: a connection past the
//     limit is rejected at the listener;
//   - keep a granted body waiting: a rendezvous body must arrive within
//     `options::read_timeout` of its grant, else the request is answered
//     DeadlineExceeded and its connection closed, which ends the receive and
//     gives the body's bytes back to the budget;
//   - queue without bound: a connection's requests waiting for room are
//     bounded in number and in the bytes they hold (eager data, copied);
//     past either bound a request is refused with ResourceExhausted at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "asio/any_io_executor.hpp"
#include "asio/awaitable.hpp"
#include "connection_limit.hpp"
#include "dlasync/dlasync.hpp"
#include "ucx_protocol.hpp"

namespace dlasync::examples {

class ucx_front {
 public:
  // A request's message as it arrived: `length` bytes in `bytes`, and their
  // room in the memory budget, given back when the last copy of `room` goes.
  // A handler may free the bytes once it has read them and keep the room for
  // what it made of them.
  struct message {
    std::unique_ptr<std::byte[]> bytes;
    std::uint32_t length = 0;
    std::shared_ptr<void> room;
    std::string peer;  // the numeric address of the client's host; empty if unknown
  };
  // The answer to a request: a serialized ModelInferResponse, or the error.
  using handler_fn = std::function<asio::awaitable<absl::StatusOr<std::string>>(message)>;
  using counter_fn = std::function<void(absl::StatusCode)>;

  struct options {
    std::string address = "127.0.0.1";
    int port = 0;            // 0: a free one (port() says which)
    std::string transports;  // UCX_TLS's syntax; empty: UCX's choice
    std::uint32_t max_body = 0;
    std::uint64_t connection_budget = 0;
    // A rendezvous body must arrive within this time of its grant
    // (--read_timeout_ms); 0: no limit.
    std::chrono::milliseconds read_timeout{0};
    // One connection's requests waiting for room in the budget: at most this
    // many (--max_queued_requests), holding at most this many bytes of
    // headers and eager data (--max_queued_kib).
    std::size_t max_queued_requests = 16;
    std::uint64_t max_queued_bytes = 256 << 10;
    // Shared with the server's other transports; null: no limit.
    std::shared_ptr<connection_limit> connections;
  };

  // What the transport did, for the server's report.
  struct counters {
    std::uint64_t connections = 0;          // accepted
    std::uint64_t refused_connections = 0;  // past the connection limit
    std::uint64_t bytes_received = 0;
    std::uint64_t refused_queue = 0;  // requests refused over the queue bounds
    std::uint64_t closed_late = 0;    // connections closed past the read deadline
  };

  // Listens; requests are answered by `handle`, each answer counted by
  // `count`. The budget bounds the received messages, as for the other
  // fronts.
  static absl::StatusOr<std::unique_ptr<ucx_front>> create(const asio::any_io_executor& executor,
                                                           options o,
                                                           std::shared_ptr<memory_budget> budget,
                                                           handler_fn handle, counter_fn count);
  ~ucx_front();

  unsigned short port() const;
  counters stats() const;
  // Requests received and not yet answered or dropped.
  struct in_progress {
    std::size_t waiting = 0;    // for room in the budget
    std::size_t receiving = 0;  // their rendezvous body
    std::size_t handling = 0;   // granted: being handled, or about to be
    std::size_t total() const { return waiting + receiving + handling; }
  };
  in_progress requests_in_progress() const;

  // Stops taking requests, lets the handlers under way answer, then closes
  // every connection and UCX; the bodies still waiting or arriving go back
  // to the budget. Idempotent. Not from the executor's threads.
  void stop();

  struct state;

 private:
  explicit ucx_front(std::shared_ptr<state> s) : state_(std::move(s)) {}
  std::shared_ptr<state> state_;
};

}  // namespace dlasync::examples
