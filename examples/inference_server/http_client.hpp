// The load client's side of the REST front: HTTP/1.1 requests written on a
// keep-alive connection, and their responses read with Debian's
// http-parser (HTTP_RESPONSE mode), one at a time.
//
//   http_client c(socket);
//   co_await c.send(request_bytes);
//   absl::StatusOr<http_response> r = co_await c.receive();
//
// Thread safety: one connection's, used by one coroutine at a time.
#pragma once

#include <http_parser.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "asio/awaitable.hpp"
#include "asio/ip/tcp.hpp"

namespace dlasync::examples {

struct http_response {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;
  bool keep_alive = true;

  std::optional<absl::string_view> header(absl::string_view name) const;
};

// A POST of `body` to `target`, with `extra` header lines (each ending in
// "\r\n"), as bytes to write.
std::string http_post(absl::string_view target, absl::string_view extra, absl::string_view host,
                      std::span<const std::byte> json, std::span<const std::byte> binary);

class http_client {
 public:
  explicit http_client(asio::ip::tcp::socket& socket);
  http_client(const http_client&) = delete;
  http_client& operator=(const http_client&) = delete;

  // Unavailable when the connection breaks.
  asio::awaitable<absl::Status> send(std::span<const std::byte> bytes);
  // The next response: Unavailable when the connection ends before it is
  // whole, InvalidArgument when it is not HTTP, or its body is past
  // `max_body` bytes.
  asio::awaitable<absl::StatusOr<http_response>> receive(std::size_t max_body = 64 << 20);

 private:
  static int on_header_field(http_parser* p, const char* at, std::size_t n);
  static int on_header_value(http_parser* p, const char* at, std::size_t n);
  static int on_body(http_parser* p, const char* at, std::size_t n);
  static int on_message_complete(http_parser* p);

  asio::ip::tcp::socket& socket_;
  http_parser parser_{};
  http_parser_settings settings_{};
  http_response current_;
  bool field_next_ = true;  // the next header bytes start a new field
  bool complete_ = false;
  std::size_t max_body_ = 0;
  bool too_large_ = false;
  std::vector<char> buffer_;
  std::size_t start_ = 0;  // bytes in buffer_ not yet parsed: [start_, end_)
  std::size_t end_ = 0;
};

}  // namespace dlasync::examples
