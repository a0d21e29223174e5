// HTTP/1.1 requests read off a connection with Debian's http-parser
// (libhttp-parser), one at a time, pipelined requests included: the parse
// stops when a request's head is complete, so that the server can check the
// head (routes, sizes, the memory budget, Expect: 100-continue) before any
// of the body is taken, and again when the request is complete.
//
//   http_parse p(limits);
//   n = p.feed(data, size);             // until p.at() == head_done
//   ... p.head() ... p.body_into(buffer, length) or p.body_grows();
//   p.go_on();
//   n = p.feed(...);                    // until p.at() == complete
//   ... p.next();                       // the connection's next request
//
// A body of known length is written where body_into() says: when feed() is
// handed bytes already there, nothing is copied. A chunked body is gathered
// into a growing buffer up to the limit.
//
// Thread safety: one connection's, used by one coroutine at a time.
#pragma once

#include <http_parser.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include "absl/strings/string_view.h"

namespace dlasync::examples {

struct http_head {
  std::string method;
  std::string target;                                        // the request target, as sent
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::optional<std::uint64_t> content_length;
  bool chunked = false;
  bool keep_alive = true;

  absl::string_view path() const;  // the target without its query
  // The first header named `name` (lower case).
  const std::string* header(absl::string_view name) const;
};

class http_parse {
 public:
  enum class stage { head, head_done, body, complete, failed };

  http_parse(std::size_t max_head_bytes, std::uint64_t max_chunked_body);
  http_parse(const http_parse&) = delete;
  http_parse& operator=(const http_parse&) = delete;

  // Parses from `data`; returns the bytes taken. Stops at head_done and at
  // complete; failed for malformed requests (error() says why, and whether
  // the head was too large).
  std::size_t feed(const char* data, std::size_t size);

  stage at() const { return stage_; }
  const http_head& head() const { return head_; }
  const std::string& error() const { return error_; }
  bool head_too_large() const { return head_too_large_; }
  bool body_too_large() const { return body_too_large_; }
  // Bytes taken in this request's head so far.
  std::size_t head_bytes() const { return head_bytes_; }

  // After head_done, for a body of known length: its bytes go to `buffer`.
  void body_into(std::byte* buffer) { body_at_ = buffer; }
  // Bytes of the body received so far.
  std::uint64_t body_received() const { return body_received_; }
  // A chunked body, gathered (after complete).
  std::vector<std::byte>& chunked_body() { return chunked_; }

  // Goes on past head_done.
  void go_on();
  // After complete: ready for the connection's next request.
  void next();

 private:
  static int on_url(http_parser* p, const char* at, std::size_t n);
  static int on_header_field(http_parser* p, const char* at, std::size_t n);
  static int on_header_value(http_parser* p, const char* at, std::size_t n);
  static int on_headers_complete(http_parser* p);
  static int on_body(http_parser* p, const char* at, std::size_t n);
  static int on_message_complete(http_parser* p);

  const std::size_t max_head_bytes_;
  const std::uint64_t max_chunked_body_;
  http_parser parser_{};
  http_parser_settings settings_{};
  stage stage_ = stage::head;
  http_head head_;
  bool in_value_ = false;
  std::size_t head_bytes_ = 0;
  bool head_too_large_ = false;
  bool body_too_large_ = false;
  std::string error_;
  std::byte* body_at_ = nullptr;
  std::uint64_t body_received_ = 0;
  std::vector<std::byte> chunked_;
};

}  // namespace dlasync::examples
