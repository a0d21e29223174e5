#include "tcp_front.hpp"

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/post.hpp"
#include "common/awaitables.hpp"

namespace dlasync::examples {

using asio::ip::tcp;
using got = peer_io::got;

void tcp_front::serve_connection(tcp::socket socket, connection_limit::slot slot) {
  stats_.connections.fetch_add(1);
  auto shared = std::make_shared<tcp::socket>(std::move(socket));
  const std::uint64_t id = sessions_.track(shared);
  asio::co_spawn(shared->get_executor(), session(shared, id, std::move(slot)), asio::detached);
}

void tcp_front::refuse_connection(tcp::socket& socket, std::size_t max_connections) {
  const response r{0, absl::StatusCode::kResourceExhausted, 0, 0,
                   absl::StrCat("the server holds ", max_connections,
                                " connections at once (--max_connections); this one is "
                                "closed: connect again when others have ended")};
  const std::vector<std::byte> bytes = encode_response(r);
  asio::error_code ignored;
  socket.non_blocking(true, ignored);
  socket.write_some(asio::buffer(bytes), ignored);
}

void tcp_front::close_all() {
  sessions_.close_all();
}

asio::awaitable<void> tcp_front::session(std::shared_ptr<tcp::socket> socket, std::uint64_t id,
                                         connection_limit::slot slot) {
  co_await serve(*socket);
  asio::error_code ignored;
  socket->close(ignored);
  {
    const connection_limit::slot closed = std::move(slot);  // its descriptor is free again
  }
  sessions_.untrack(id);
}

asio::awaitable<bool> tcp_front::reply(peer_io& peer, const response& r) {
  stats_.count_answer(r.code);
  const got sent = co_await peer.send(r);
  if (sent == got::late) stats_.closed_late.fetch_add(1);
  co_return sent == got::all;
}

// Tells a peer past the read deadline why it is disconnected (it sees the
// response if it still reads); the caller then closes the connection.
asio::awaitable<void> tcp_front::cut_off(peer_io& peer, const char* what) {
  stats_.closed_late.fetch_add(1);
  stats_.count_error(absl::StatusCode::kDeadlineExceeded);
  const response r{0, absl::StatusCode::kDeadlineExceeded, 0, 0,
                   absl::StrCat(what, " did not arrive within ", peer.read_timeout().count(),
                                " ms (--read_timeout_ms); closing the connection")};
  co_await peer.send(r);
}

// Answers a frame with an error and skips its body; false when the
// connection ends.
asio::awaitable<bool> tcp_front::refuse(peer_io& peer, const response& refusal,
                                        std::uint64_t body_bytes) {
  const bool sent = co_await reply(peer, refusal);
  if (!sent) co_return false;
  const got skipped = co_await peer.discard(body_bytes);
  if (skipped == got::late) co_await cut_off(peer, "the refused request's body");
  co_return skipped == got::all;
}

asio::awaitable<void> tcp_front::serve(tcp::socket& socket) {
  peer_io peer(socket, {limits_.read_timeout, limits_.idle_timeout});
  for (;;) {
    std::array<std::byte, frame_header_bytes> header;
    const got head = co_await peer.read_header(header);
    if (head == got::idle) stats_.closed_idle.fetch_add(1);
    if (head == got::late) co_await cut_off(peer, "a frame header");
    if (head != got::all) co_return;  // closed between frames, or cut off in a header
    absl::StatusOr<std::uint32_t> body_length =
        read_frame_header(header, request_magic, limits_.max_body);
    // GCC 12 mishandles temporaries in co_await expressions inside
    // conditions: each response is a named variable, each co_await its own
    // statement.
    if (!body_length.ok()) {
      const response refusal{0, body_length.status().code(), 0, 0,
                             std::string(body_length.status().message())};
      if (body_length.status().code() != absl::StatusCode::kOutOfRange) {
        stats_.closed_unframed.fetch_add(1);
        co_await reply(peer, refusal);
        co_return;
      }
      // The body length was read: skip the body and go on.
      std::uint32_t skip;
      std::memcpy(&skip, header.data() + 4, sizeof skip);
      const bool goes_on = co_await refuse(peer, refusal, skip);
      if (!goes_on) co_return;
      continue;
    }
    const std::uint32_t length = *body_length;
    const bool within_budget = length <= budget_->limit();
    if (!within_budget) {
      const absl::Status over = over_whole_budget(length, budget_->limit());
      const response refusal{0, over.code(), 0, 0, std::string(over.message())};
      const bool goes_on = co_await refuse(peer, refusal, length);
      if (!goes_on) co_return;
      continue;
    }
    if (length > limits_.connection_budget) {
      stats_.refused_connection_budget.fetch_add(1);
      const response refusal{
          0, absl::StatusCode::kResourceExhausted, 0, 0,
          absl::StrCat("request of ", length, " bytes exceeds the per-connection budget of ",
                       limits_.connection_budget,
                       " bytes (--connection_budget_mib): send smaller tensors")};
      const bool goes_on = co_await refuse(peer, refusal, length);
      if (!goes_on) co_return;
      continue;
    }
    const got arriving = co_await peer.body_arriving(length);
    if (arriving == got::late) co_await cut_off(peer, "the request's body");
    if (arriving != got::all) co_return;
    const absl::Status granted = co_await acquire(*budget_, length);
    if (!granted.ok()) {
      const response refusal{0, granted.code(), 0, 0,
                             absl::StrCat("request of ", length, " bytes: ", granted.message())};
      const bool goes_on = co_await refuse(peer, refusal, length);
      if (!goes_on) co_return;
      continue;
    }
    // The body returns its bytes to the budget when the last user drops it:
    // this coroutine, or the imported tensor that views it.
    std::shared_ptr<std::byte[]> body(new std::byte[length],
                                      [budget = budget_, bytes = length](std::byte* p) {
                                        delete[] p;
                                        budget->release(bytes);
                                      });
    // The deadline runs from the grant: waiting for room is the server's
    // doing, not the peer's.
    const got read = co_await peer.read(asio::buffer(body.get(), length));
    if (read != got::all) {
      body.reset();  // back to the budget before anything else
      if (read == got::late) co_await cut_off(peer, "the request's body");
      co_return;  // cut off mid-frame, by the peer or the deadline
    }
    stats_.bytes_received.fetch_add(frame_header_bytes + length);
    const response r = co_await handle_(std::move(body), length);
    const bool sent = co_await reply(peer, r);
    if (!sent) co_return;
  }
}

}  // namespace dlasync::examples
