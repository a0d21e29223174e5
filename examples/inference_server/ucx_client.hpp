// The load client's side of the server's UCX transport (ucx_front.hpp):
// connections to the server's UCX listener, each sending one request frame
// at a time as an active message and waiting for its response.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "asio/any_io_executor.hpp"
#include "frame.hpp"

namespace dlasync::examples {

class ucx_client {
 public:
  // Progress runs on `executor` (its threads must run while calls wait).
  static absl::StatusOr<std::unique_ptr<ucx_client>> create(const asio::any_io_executor& executor,
                                                            const std::string& transports);
  ~ucx_client();

  // A new connection to host:port; its index for call().
  absl::StatusOr<int> connect(const std::string& host, int port);

  // Sends `frame` (its first bytes as the message's header, the rest as
  // its data) on connection `c` and waits for the response: Unavailable
  // when the connection broke, DeadlineExceeded after `timeout`.
  // One call at a time per connection; calls on distinct connections may
  // run from different threads.
  absl::StatusOr<response> call(int c, std::span<const std::byte> frame,
                                std::chrono::milliseconds timeout);

  // call() in two halves, for many requests in flight on one connection:
  // send() returns once the request is on its way; receive() waits for the
  // connection's next answer (answers come in the order the server gives
  // them). `rendezvous`: the data goes by rendezvous whatever its size
  // (UCP_AM_SEND_FLAG_RNDV); otherwise UCX chooses.
  absl::Status send(int c, std::span<const std::byte> frame, bool rendezvous = false);
  absl::StatusOr<response> receive(int c, std::chrono::milliseconds timeout);

  // Any active message, for peers that break the protocol on purpose: id
  // `id`, `header` as its header, `data_bytes` bytes of `fill` as its data,
  // UCP_AM_SEND_FLAG_REPLY when `reply`. Does not wait for an answer.
  absl::Status send_raw(int c, unsigned id, bool reply, std::span<const std::byte> header,
                        std::size_t data_bytes, std::byte fill);

  // A peer that stops progressing: sends `frame` on each of `connections`,
  // its data by rendezvous, and then makes no UCX progress at all (nothing
  // sent or received, no rendezvous served) until `while_stalled` returns.
  // For the announcements to go out at once, each connection must be set up
  // for rendezvous first (a request sent with `rendezvous` and answered).
  absl::Status stall(std::span<const int> connections, std::span<const std::byte> frame,
                     const std::function<void()>& while_stalled);

  void stop();

  struct state;

 private:
  explicit ucx_client(std::shared_ptr<state> s) : state_(std::move(s)) {}
  std::shared_ptr<state> state_;
};

}  // namespace dlasync::examples
