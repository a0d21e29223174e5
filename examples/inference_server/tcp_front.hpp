// The inference server's TCP transport: request frames (frame.hpp) on
// connections that an accept_loop hands over, answered one after the other.
//
// Each connection is one coroutine on its own strand: read a header, check
// it, wait for the body's first byte, reserve the memory budget, read the
// body, handle it, reply; then the next frame. Every read and write has a
// deadline (peer_io.hpp), so a slow peer is cut off; a malformed frame is
// answered and the connection goes on, unless the next frame cannot be
// found any more (a wrong magic).
//
//   tcp_front tcp(handle, budget, limits, stats);
//   accept_loop loop(acceptor, limit, {}, [&](tcp::socket s, connection_limit::slot slot) {
//     tcp.serve_connection(std::move(s), std::move(slot));
//   }, ...);
//   ...
//   tcp.close_all();
//
// Thread safety: all members are safe to call from any thread; close_all()
// waits, so not from the executor's threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "asio/awaitable.hpp"
#include "asio/ip/tcp.hpp"
#include "connection_limit.hpp"
#include "dlasync/dlasync.hpp"
#include "frame.hpp"
#include "peer_io.hpp"
#include "server_stats.hpp"
#include "session_set.hpp"

namespace dlasync::examples {

class tcp_front {
 public:
  using handler_fn =
      std::function<asio::awaitable<response>(std::shared_ptr<std::byte[]>, std::uint32_t)>;

  // Bodies are reserved from `budget`; answers and cut-offs are counted in
  // `stats`, which outlives this object.
  tcp_front(handler_fn handle, std::shared_ptr<memory_budget> budget, const server_limits& limits,
            server_stats& stats)
      : handle_(std::move(handle)), budget_(std::move(budget)), limits_(limits), stats_(stats) {}

  // Serves one accepted connection, which holds `slot` until it ends.
  void serve_connection(asio::ip::tcp::socket socket, connection_limit::slot slot);

  // Tells a connection turned away (past --max_connections) why, when the
  // socket takes the answer at once; never blocks.
  static void refuse_connection(asio::ip::tcp::socket& socket, std::size_t max_connections);

  // Closes every connection (on its own strand) and waits until all ended.
  void close_all();

 private:
  asio::awaitable<void> session(std::shared_ptr<asio::ip::tcp::socket> socket, std::uint64_t id,
                                connection_limit::slot slot);
  asio::awaitable<bool> reply(peer_io& peer, const response& r);
  // Tells a peer past the read deadline why it is disconnected (it sees the
  // response if it still reads); the caller then closes the connection.
  asio::awaitable<void> cut_off(peer_io& peer, const char* what);
  // Answers a frame with an error and skips its body; false when the
  // connection ends.
  asio::awaitable<bool> refuse(peer_io& peer, const response& refusal, std::uint64_t body_bytes);
  asio::awaitable<void> serve(asio::ip::tcp::socket& socket);

  handler_fn handle_;
  std::shared_ptr<memory_budget> budget_;
  const server_limits limits_;
  server_stats& stats_;
  session_set sessions_;
};

}  // namespace dlasync::examples
