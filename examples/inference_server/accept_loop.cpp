#include "accept_loop.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "asio/co_spawn.hpp"
#include "asio/experimental/as_tuple.hpp"
#include "asio/post.hpp"
#include "asio/use_awaitable.hpp"

namespace dlasync::examples {

using asio::ip::tcp;

accept_loop::accept_loop(tcp::acceptor& acceptor, std::shared_ptr<connection_limit> limit,
                         accept_backoff backoff, serve_fn serve, refuse_fn refuse,
                         executor_fn executor)
    : acceptor_(acceptor),
      limit_(std::move(limit)),
      backoff_(backoff),
      serve_(std::move(serve)),
      refuse_(std::move(refuse)),
      executor_(std::move(executor)),
      wait_(acceptor.get_executor()) {}

void accept_loop::start() {
  started_ = true;
  asio::co_spawn(acceptor_.get_executor(), run(),
                 [this](const std::exception_ptr&) { ended_.set_value(); });
}

void accept_loop::stop() {
  if (!started_) return;
  started_ = false;
  asio::post(acceptor_.get_executor(), [this] {
    asio::error_code ignored;
    acceptor_.close(ignored);
    wait_.cancel();
  });
  ended_.get_future().wait();
}

asio::awaitable<void> accept_loop::run() {
  constexpr auto as_tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);
  std::chrono::milliseconds wait = backoff_.first;
  std::uint64_t failed_in_a_row = 0;
  for (;;) {
    auto [ec, socket] = co_await acceptor_.async_accept(executor_(), as_tuple_awaitable);
    if (!acceptor_.is_open()) co_return;  // stop()
    if (ec) {
      // Out of descriptors or kernel memory, most often: accepting again at
      // once would fail again (the connection stays queued), so wait for
      // connections to end, longer after each failure in a row.
      stats_.failures.fetch_add(1);
      if (failed_in_a_row++ == 0) {
        stats_.bursts.fetch_add(1);
        std::fprintf(stderr,
                     "dlasync server: accepting a connection failed (%s); trying again in %lld ms, "
                     "waiting up to %lld ms between tries while it fails\n",
                     ec.message().c_str(), static_cast<long long>(wait.count()),
                     static_cast<long long>(backoff_.most.count()));
      }
      wait_.expires_after(wait);
      co_await wait_.async_wait(as_tuple_awaitable);
      wait = std::min(wait * 2, backoff_.most);
      if (!acceptor_.is_open()) co_return;
      continue;
    }
    if (failed_in_a_row > 0) {
      std::fprintf(stderr, "dlasync server: accepting again, after %llu failed accepts\n",
                   static_cast<unsigned long long>(failed_in_a_row));
      failed_in_a_row = 0;
      wait = backoff_.first;
    }
    stats_.accepted.fetch_add(1);
    std::optional<connection_limit::slot> slot = limit_->try_take();
    if (!slot) {
      refuse_(socket);
      asio::error_code ignored;
      socket.shutdown(tcp::socket::shutdown_both, ignored);
      socket.close(ignored);
      continue;
    }
    serve_(std::move(socket), std::move(*slot));
  }
}

}  // namespace dlasync::examples
