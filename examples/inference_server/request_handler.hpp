// The inference server's handler proper, whichever transport carried the
// request: parse the frame's body (frame.hpp), import its tensor onto the
// server's device with dlasync, sum its elements there.
//
//   request_handler handler(rt, compute, target);
//   response r = co_await handler.handle(std::move(body), length);
//
// Thread safety: handle() may run from any number of coroutines at once.
#pragma once

#include <cstdint>
#include <memory>

#include "asio/awaitable.hpp"
#include "common/device_sum.hpp"
#include "dlasync/dlasync.hpp"
#include "frame.hpp"

namespace dlasync::examples {

class request_handler {
 public:
  // `rt` and `compute` outlive the handler and every handle() under way.
  request_handler(runtime& rt, device_sum& compute, device target)
      : rt_(rt), compute_(compute), target_(target) {}

  // The answer to the request whose body, `length` bytes, is `body`: the
  // sum, or the error that names what is wrong. The payload is imported in
  // place; the tensor keeps `body` alive while it views it.
  asio::awaitable<response> handle(std::shared_ptr<std::byte[]> body, std::uint32_t length);

 private:
  runtime& rt_;
  device_sum& compute_;
  const device target_;
};

}  // namespace dlasync::examples
