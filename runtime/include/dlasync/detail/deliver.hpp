// dlasync/detail/deliver.hpp
//
// Plumbing for dlasync's Asio initiating functions: a completion that
// arrives on any thread (a worker, the CUDA reactor) is handed to the
// handler on the handler's own executor. Not for direct use.
#pragma once

#include <utility>

#include "absl/functional/any_invocable.h"
#include "asio/associated_cancellation_slot.hpp"
#include "asio/associated_executor.hpp"
#include "asio/execution/outstanding_work.hpp"
#include "asio/post.hpp"
#include "asio/prefer.hpp"
#include "dlasync/runtime.hpp"

namespace dlasync::detail {

// Wraps `handler` so that calling the result posts the handler, with its
// argument, to the handler's associated executor (the runtime's when it has
// none), holding outstanding work on it meanwhile. The handler's
// cancellation slot is cleared there, just before the call.
template <typename Result, typename Handler>
absl::AnyInvocable<void(Result) &&> deliver_to(Handler handler, runtime& rt) {
  auto work = asio::prefer(asio::get_associated_executor(handler, rt.get_executor()),
                           asio::execution::outstanding_work.tracked);
  return [handler = std::move(handler), work = std::move(work)](Result result) mutable {
    auto executor = std::move(work);
    asio::post(executor, [handler = std::move(handler), result = std::move(result)]() mutable {
      asio::get_associated_cancellation_slot(handler).clear();
      std::move(handler)(std::move(result));
    });
  };
}

}  // namespace dlasync::detail
