// The load client's side of the server's UCX transport (ucx_front.hpp,
// ucx_protocol.hpp): connections to the server's UCX listener, each sending
// requests (serialized ModelInferRequest messages) as active messages and
// taking their answers.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "asio/any_io_executor.hpp"

namespace dlasync::examples {

// An answer from the server: the request's tag, its status code, and the
// serialized ModelInferResponse (OK) or the error message (else).
struct ucx_answer {
  std::uint64_t tag = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string bytes;
};

class ucx_client {
 public:
  // Progress runs on `executor` (its threads must run while calls wait).
  static absl::StatusOr<std::unique_ptr<ucx_client>> create(const asio::any_io_executor& executor,
                                                            const std::string& transports);
  ~ucx_client();

  // A new connection to host:port; its index for call().
  absl::StatusOr<int> connect(const std::string& host, int port);

  // Sends `message` with `tag` on connection `c` and waits for the answer:
  // Unavailable when the connection broke, DeadlineExceeded after
  // `timeout`, InvalidArgument for an answer that breaks the protocol.
  // One call at a time per connection; calls on distinct connections may
  // run from different threads.
  absl::StatusOr<ucx_answer> call(int c, std::uint64_t tag, std::span<const std::byte> message,
                                  std::chrono::milliseconds timeout);

  // call() in two halves, for many requests in flight on one connection:
  // send() returns once the request is on its way; receive() waits for the
  // connection's next answer (in the order they arrive). `rendezvous`: the
  // data goes by rendezvous whatever its size (UCP_AM_SEND_FLAG_RNDV);
  // otherwise UCX chooses.
  absl::Status send(int c, std::uint64_t tag, std::span<const std::byte> message,
                    bool rendezvous = false);
  absl::StatusOr<ucx_answer> receive(int c, std::chrono::milliseconds timeout);

  // Any active message, for peers that break the protocol on purpose: id
  // `id`, `header` as its header, `data_bytes` bytes of `fill` as its data,
  // UCP_AM_SEND_FLAG_REPLY when `reply`. Does not wait for an answer.
  absl::Status send_raw(int c, unsigned id, bool reply, std::span<const std::byte> header,
                        std::size_t data_bytes, std::byte fill);

  // A peer that stops progressing: sends `message` on each of `connections`,
  // its data by rendezvous, and then makes no UCX progress at all (nothing
  // sent or received, no rendezvous served) until `while_stalled` returns.
  // For the announcements to go out at once, each connection must be set up
  // for rendezvous first (a request sent with `rendezvous` and answered).
  absl::Status stall(std::span<const int> connections, std::uint64_t tag,
                     std::span<const std::byte> message,
                     const std::function<void()>& while_stalled);

  void stop();

  struct state;

 private:
  explicit ucx_client(std::shared_ptr<state> s) : state_(std::move(s)) {}
  std::shared_ptr<state> state_;
};

}  // namespace dlasync::examples
