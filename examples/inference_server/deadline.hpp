// Deadlines for socket operations, for the inference server and its client.
//
// `before(deadline, op)` races an operation against a steady_timer: whichever
// completes first cancels the other, and the result says which one won. No
// thread waits; the timer is an ordinary asynchronous operation.
//
//   auto got = co_await before(deadline_after(timeout),
//                              asio::async_read(socket, buffer, as_tuple_awaitable));
//   if (!got) ...  // the deadline passed: the read was cancelled
#pragma once

#include <chrono>
#include <optional>
#include <tuple>
#include <utility>
#include <variant>

#include "asio/awaitable.hpp"
#include "asio/experimental/as_tuple.hpp"
#include "asio/experimental/awaitable_operators.hpp"
#include "asio/steady_timer.hpp"
#include "asio/this_coro.hpp"
#include "asio/use_awaitable.hpp"

namespace dlasync::examples {

using deadline_clock = std::chrono::steady_clock;
inline constexpr deadline_clock::time_point no_deadline = deadline_clock::time_point::max();

// The time `timeout` from now; no_deadline when `timeout` is not positive.
inline deadline_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return timeout.count() > 0 ? deadline_clock::now() + timeout : no_deadline;
}

// Awaits `op` unless `deadline` passes first. Returns op's result, or nullopt
// when the deadline came first; op was then cancelled and has completed, so
// the buffers it used may go. Lazy: nothing starts until the result is
// awaited, and the awaiting coroutine resumes on its own executor (a strand
// keeps op and the timer apart from the connection's other work). `op` must
// report errors in its result (as_tuple), not throw.
template <typename T>
asio::awaitable<std::optional<T>> before(deadline_clock::time_point deadline,
                                         asio::awaitable<T> op) {
  if (deadline == no_deadline) co_return co_await std::move(op);
  using namespace asio::experimental::awaitable_operators;
  asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
  auto expiry = timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  std::variant<T, std::tuple<asio::error_code>> first =
      co_await (std::move(op) || std::move(expiry));
  if (first.index() != 0) co_return std::nullopt;
  co_return std::get<0>(std::move(first));
}

}  // namespace dlasync::examples
