// The inference server's UCX transport: the same requests and responses as
// the TCP frames (frame.hpp), carried as UCX active messages.
//
// A client connects to the server's UCX listener (`--ucx_port`) and sends
// each request as one active message (id `ucx_request_am`) with
// UCP_AM_SEND_FLAG_REPLY: its header is the request frame's first bytes
// (at least the 8-byte frame header), its data the rest of the frame, which
// UCX carries eagerly when small and by rendezvous when large. The server
// checks the frame header (magic, body length against --max_frame_mib and
// against what the message carries) and the budgets before it takes any of
// the data: a rendezvous payload is received straight into a buffer granted
// by the server's memory budget, once granted. The body then goes through
// the same handler as a TCP frame (parse, import, sum), and the response
// frame returns as an active message (id `ucx_response_am`) whose header is
// the whole frame.
//
// Malformed requests get the TCP transport's answers. A UCX message cannot
// lose its framing, so a wrong magic or a body length that disagrees with the
// message is answered (InvalidArgument) and the connection goes on.
//
// What a peer cannot do (the TCP transport's promises, kept over UCX):
//   - hold more than `options::connections` allows: a connection past the
//     limit is rejected at the listener;
//   - keep a granted body waiting: a rendezvous body must arrive within
//     `options::read_timeout` of its grant, else the request is answered
//     DeadlineExceeded and its connection closed, which ends the receive and
//     gives the body's bytes back to the budget;
//   - queue without bound: a connection's requests waiting for room are
//     bounded in number and in the bytes they hold (headers and eager data,
//     copied); past either bound a request is refused with
//     ResourceExhausted at once.
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
#include "frame.hpp"

namespace dlasync::examples {

inline constexpr unsigned ucx_request_am = 0x51;
inline constexpr unsigned ucx_response_am = 0x52;

class ucx_front {
 public:
  using handler_fn =
      std::function<asio::awaitable<response>(std::shared_ptr<std::byte[]>, std::uint32_t)>;
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
  // `count`. The budget bounds the received bodies, as for TCP.
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
