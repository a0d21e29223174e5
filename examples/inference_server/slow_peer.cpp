#include "slow_peer.hpp"

#include <array>
#include <optional>
#include <tuple>
#include <variant>

#include "absl/strings/str_cat.h"
#include "asio/experimental/as_tuple.hpp"
#include "asio/experimental/awaitable_operators.hpp"
#include "asio/steady_timer.hpp"
#include "asio/this_coro.hpp"
#include "asio/use_awaitable.hpp"
#include "asio/write.hpp"
#include "http_client.hpp"

namespace dlasync::examples {
namespace {

using asio::ip::tcp;
constexpr auto as_tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

void note_problem(slow_peer_stats& stats, std::string what) {
  std::lock_guard lock(stats.mutex);
  stats.problems.push_back(std::move(what));
}

// Sends `bytes` bytes one at a time; false as soon as the server broke the
// connection, true when they were all sent or `give_up_at` passed.
asio::awaitable<bool> trickle(tcp::socket& socket, std::uint32_t bytes,
                              const slow_peer_options& options,
                              std::chrono::steady_clock::time_point give_up_at) {
  asio::steady_timer timer(socket.get_executor());
  const std::array<std::byte, 1> one{std::byte{0}};
  for (std::uint32_t i = 0; i < bytes && std::chrono::steady_clock::now() < give_up_at; ++i) {
    timer.expires_after(options.interval);
    auto [waited] = co_await timer.async_wait(as_tuple_awaitable);
    if (waited) co_return true;  // cancelled: the server's side ended first
    auto [ec, n] = co_await asio::async_write(socket, asio::buffer(one), as_tuple_awaitable);
    if (ec) co_return false;
  }
  co_return true;
}

// Reads until the server closes the connection; the HTTP status of the
// first response it sent, if one came whole.
asio::awaitable<std::optional<int>> watch(tcp::socket& socket) {
  http_client client(socket);
  absl::StatusOr<http_response> r = co_await client.receive(64 << 10);
  // Then the close that must follow.
  std::array<std::byte, 4096> chunk;
  for (;;) {
    auto [ec, n] = co_await socket.async_read_some(asio::buffer(chunk), as_tuple_awaitable);
    if (ec) break;
  }
  if (!r.ok()) co_return std::nullopt;
  co_return r->status;
}

}  // namespace

asio::awaitable<void> slow_peer(tcp::endpoint server, slow_peer_options options,
                                slow_peer_stats& stats) {
  tcp::socket socket(co_await asio::this_coro::executor);
  auto [ec] = co_await socket.async_connect(server, as_tuple_awaitable);
  if (ec) {
    note_problem(stats, absl::StrCat("slow peer cannot connect: ", ec.message()));
    co_return;
  }
  // The head and the body's first byte at once: the server reserves room for
  // a body once its head has come.
  const std::string start =
      absl::StrCat("POST /v2/models/sum/infer HTTP/1.1\r\nHost: ", options.host,
                   "\r\nContent-Length: ", options.announced_bytes, "\r\n\r\n{");
  auto [sent_ec, sent] =
      co_await asio::async_write(socket, asio::buffer(start), as_tuple_awaitable);
  if (sent_ec) {
    note_problem(stats, absl::StrCat("slow peer cannot send its head: ", sent_ec.message()));
    co_return;
  }
  stats.started.fetch_add(1);
  const auto first_byte_at = std::chrono::steady_clock::now();
  using namespace asio::experimental::awaitable_operators;
  std::variant<bool, std::optional<int>> ended =
      co_await (trickle(socket, options.announced_bytes - 1, options,
                        first_byte_at + options.give_up_after) ||
                watch(socket));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first_byte_at)
          .count();
  if (ended.index() == 0 && std::get<0>(ended)) {
    note_problem(stats, absl::StrCat("slow peer still connected after ", ms, " ms"));
    co_return;
  }
  stats.disconnected.fetch_add(1);
  if (ended.index() == 1 && std::get<1>(ended) == 408) stats.told_deadline.fetch_add(1);
  std::lock_guard lock(stats.mutex);
  stats.disconnected_after_ms.push_back(ms);
}

}  // namespace dlasync::examples
