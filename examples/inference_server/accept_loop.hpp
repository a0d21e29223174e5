// A TCP server's accept loop that no peer can stop.
//
// `accept_loop` accepts connections on a listening acceptor until `stop()`,
// whatever the accepts fail with. An accept fails when the process has no
// descriptor left (EMFILE, ENFILE) or the kernel no memory (ENOBUFS,
// ENOMEM), which any peer can cause by opening connections; the loop then
// waits, a little longer after each failure in a row (`accept_backoff`), so
// that connections that end give their descriptors back, and goes on. The
// first failure of a burst is logged, and the end of the burst; the others
// are counted. Each accepted connection takes a slot of a `connection_limit`
// (shared with the server's other transports); past the limit it is handed to
// `refuse` (which may write a short answer without blocking) and closed at
// once, so that a peer learns at once that it was turned away.
//
//   accept_loop loop(acceptor, limit, {}, serve, refuse, [&] { return make_strand(ex); });
//   loop.start();
//   ...
//   loop.stop();  // closes the acceptor; returns when the loop has ended
//
// Thread safety: start() and stop() from any thread, but not from the
// acceptor's executor (stop() waits for the loop); the callbacks run on the
// acceptor's executor.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>

#include "asio/any_io_executor.hpp"
#include "asio/awaitable.hpp"
#include "asio/ip/tcp.hpp"
#include "asio/steady_timer.hpp"
#include "connection_limit.hpp"

namespace dlasync::examples {

// The waits between failed accepts: `first` after the first failure of a
// burst, doubling up to `most`.
struct accept_backoff {
  std::chrono::milliseconds first{10};
  std::chrono::milliseconds most{1000};
};

struct accept_stats {
  std::atomic<std::uint64_t> accepted{0};  // refused ones included
  std::atomic<std::uint64_t> failures{0};  // accepts that failed
  std::atomic<std::uint64_t> bursts{0};    // runs of failures in a row
};

class accept_loop {
 public:
  // Takes the connection and its slot.
  using serve_fn = std::function<void(asio::ip::tcp::socket, connection_limit::slot)>;
  // Called with a connection past the limit, before it is closed; must not
  // block.
  using refuse_fn = std::function<void(asio::ip::tcp::socket&)>;
  // The executor of each accepted socket (a strand, for instance).
  using executor_fn = std::function<asio::any_io_executor()>;

  // `acceptor` is listening, on a strand or a one-thread executor, and
  // outlives this object.
  accept_loop(asio::ip::tcp::acceptor& acceptor, std::shared_ptr<connection_limit> limit,
              accept_backoff backoff, serve_fn serve, refuse_fn refuse, executor_fn executor);
  accept_loop(const accept_loop&) = delete;
  accept_loop& operator=(const accept_loop&) = delete;
  // Requires stop() first, when start() was called.
  ~accept_loop() = default;

  void start();
  // Closes the acceptor (on its executor) and waits until the loop ended.
  void stop();

  const accept_stats& stats() const noexcept { return stats_; }

 private:
  asio::awaitable<void> run();

  asio::ip::tcp::acceptor& acceptor_;
  std::shared_ptr<connection_limit> limit_;
  const accept_backoff backoff_;
  serve_fn serve_;
  refuse_fn refuse_;
  executor_fn executor_;
  asio::steady_timer wait_;
  accept_stats stats_;
  std::promise<void> ended_;
  bool started_ = false;
};

}  // namespace dlasync::examples
