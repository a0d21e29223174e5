// The inference server's reads and writes on one connection, each within a
// deadline (deadline.hpp), so that a slow peer cannot hold the server's
// resources for as long as it likes.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "asio/awaitable.hpp"
#include "asio/buffer.hpp"
#include "asio/ip/tcp.hpp"
#include "frame.hpp"

namespace dlasync::examples {

struct peer_deadlines {
  std::chrono::milliseconds read{0};  // each part of a frame, each reply; 0: none
  std::chrono::milliseconds idle{0};  // the start of the next frame; 0: none
};

// One connection's socket, which it does not own, with its deadlines. Each
// operation starts its deadline when it starts. Thread safety: use it from
// the connection's strand only.
class peer_io {
 public:
  // How an operation ended: in full, with the connection closed or broken,
  // or past the idle or read deadline (the operation was cancelled).
  enum class got { all, closed, idle, late };

  peer_io(asio::ip::tcp::socket& socket, peer_deadlines deadlines)
      : socket_(socket), deadlines_(deadlines) {}

  std::chrono::milliseconds read_timeout() const { return deadlines_.read; }

  // A frame's header: the peer may take the idle timeout to start it, then
  // the read timeout to finish it.
  asio::awaitable<got> read_header(std::array<std::byte, frame_header_bytes>& header);

  // Waits until the first of `length` body bytes is there (at once when
  // `length` is 0 or bytes are waiting already).
  asio::awaitable<got> body_arriving(std::uint32_t length);

  // Fills `buffer`.
  asio::awaitable<got> read(asio::mutable_buffer buffer);

  // Reads and drops `bytes` bytes, all within one read timeout.
  asio::awaitable<got> discard(std::uint64_t bytes);

  // Writes `r`; the peer must take it within the read timeout.
  asio::awaitable<got> send(const response& r);

 private:
  asio::awaitable<got> read_until(asio::mutable_buffer buffer,
                                  std::chrono::steady_clock::time_point deadline);

  asio::ip::tcp::socket& socket_;
  const peer_deadlines deadlines_;
};

}  // namespace dlasync::examples
