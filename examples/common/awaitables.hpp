// Example support: the copy budget's grant as an awaitable.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "asio/associated_executor.hpp"
#include "asio/async_result.hpp"
#include "asio/awaitable.hpp"
#include "asio/executor_work_guard.hpp"
#include "asio/post.hpp"
#include "asio/use_awaitable.hpp"
#include "dlasync/dlasync.hpp"

namespace dlasync::examples {

namespace detail {

// Runs `handler(status)` on its own executor, from whichever thread calls.
template <typename Handler>
auto resume_on_executor(Handler handler) {
  auto work = asio::make_work_guard(asio::get_associated_executor(handler));
  return [handler = std::move(handler), work = std::move(work)](absl::Status s) mutable {
    auto ex = work.get_executor();
    asio::post(ex, [handler = std::move(handler), s = std::move(s)]() mutable {
      std::move(handler)(std::move(s));
    });
  };
}

}  // namespace detail

// Resumes when `budget` grants `bytes` (OK: the caller must release them) or
// refuses them (ResourceExhausted for more than the whole budget).
inline asio::awaitable<absl::Status> acquire(memory_budget& budget, std::uint64_t bytes) {
  return asio::async_initiate<decltype(asio::use_awaitable), void(absl::Status)>(
      [&budget, bytes](auto handler) {
        budget.acquire(bytes, detail::resume_on_executor(std::move(handler)));
      },
      asio::use_awaitable);
}

}  // namespace dlasync::examples
