// The load client's side of the server's UCX transport (ucx_front.hpp):
// connections to the server's UCX listener, each sending one request frame
// at a time as an active message and waiting for its response.
#pragma once

#include <chrono>
#include <cstddef>
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
  static absl::StatusOr<std::unique_ptr<ucx_client>> create(asio::any_io_executor executor,
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

  void stop();

  struct state;

 private:
  explicit ucx_client(std::shared_ptr<state> s) : state_(std::move(s)) {}
  std::shared_ptr<state> state_;
};

}  // namespace dlasync::examples
