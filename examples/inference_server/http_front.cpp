#include "http_front.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <optional>
#include <span>
#include <utility>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/experimental/as_tuple.hpp"
#include "asio/read.hpp"
#include "asio/use_awaitable.hpp"
#include "asio/write.hpp"
#include "common/awaitables.hpp"
#include "deadline.hpp"
#include "http_parse.hpp"
#include "kserve_json.hpp"

#ifndef DLASYNC_SERVER_VERSION
#define DLASYNC_SERVER_VERSION "unknown"
#endif

namespace dlasync::examples {

using asio::ip::tcp;

namespace {

constexpr auto as_tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);
constexpr std::size_t read_buffer_bytes = std::size_t{64} * 1024;
// A chunked body takes the memory budget in steps of this many bytes.
constexpr std::uint64_t chunked_step = std::uint64_t{64} * 1024;
constexpr std::array<absl::string_view, 2> extensions{"binary_tensor_data", "system_shared_memory"};
// Where a body's binary data starts, in its buffer.
constexpr std::uint64_t body_alignment = 64;

absl::string_view reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Internal Server Error";
  }
}

// A chunked body, its bytes taken from the memory budget step by step.
struct budgeted_body {
  std::vector<std::byte> bytes;
  std::shared_ptr<memory_budget> budget;
  std::uint64_t held = 0;
  budgeted_body() = default;
  budgeted_body(const budgeted_body&) = delete;
  budgeted_body& operator=(const budgeted_body&) = delete;
  ~budgeted_body() {
    if (held > 0) budget->release(held);
  }
};

std::optional<std::uint64_t> parse_length(const std::string& text) {
  std::uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty()) return std::nullopt;
  return v;
}

}  // namespace

struct http_front::reply {
  int status = 200;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string json;
  std::vector<std::span<const std::byte>> binary;
  std::shared_ptr<const void> owner;  // keeps `binary` alive
  std::string headers;                // extra header lines
  bool close = false;

  static reply ok(std::string body) {
    reply r;
    r.json = std::move(body);
    return r;
  }
  static reply error(const absl::Status& s, bool close = false) {
    reply r;
    r.status = http_status(s.code());
    r.code = s.code();
    r.json = kserve::encode_error(s.message());
    r.close = close;
    return r;
  }
  static reply error(int status, absl::StatusCode code, absl::string_view message,
                     bool close = false) {
    reply r = error(absl::Status(code, message), close);
    r.status = status;
    return r;
  }
};

int http_front::http_status(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists: return 409;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

// One connection: its read buffer, its parse, its replies.
class http_front::connection {
 public:
  connection(http_front& front, tcp::socket& socket)
      : front_(front),
        socket_(socket),
        buffer_(read_buffer_bytes),
        parse_(front.max_head_bytes_, front.limits_.max_body) {}

  asio::awaitable<void> serve();

 private:
  enum class got { bytes, closed, late };

  // Reads more into the buffer, before `deadline`.
  asio::awaitable<got> read_more(deadline_clock::time_point deadline);
  asio::awaitable<got> read_some(asio::mutable_buffer into, deadline_clock::time_point deadline,
                                 std::size_t& n);
  asio::awaitable<bool> send(const reply& r);
  asio::awaitable<bool> send_raw(absl::string_view text);
  // Reads the body that the head announced into budgeted memory; an error
  // reply (the connection then closes) when it cannot.
  asio::awaitable<std::optional<reply>> read_body(std::shared_ptr<std::byte[]>& body,
                                                  std::uint64_t& length);
  // The reply to a request that cannot be served before its body is read
  // (an unknown route, a wrong method): nullopt when it can.
  std::optional<reply> refuse_early(const http_head& head, const std::optional<endpoint>& e) const;

  http_front& front_;
  tcp::socket& socket_;
  std::vector<char> buffer_;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  http_parse parse_;
};

asio::awaitable<http_front::connection::got> http_front::connection::read_some(
    asio::mutable_buffer into, deadline_clock::time_point deadline, std::size_t& n) {
  std::optional<std::tuple<asio::error_code, std::size_t>> read =
      co_await before(deadline, socket_.async_read_some(into, as_tuple_awaitable));
  if (!read) co_return got::late;
  if (std::get<0>(*read)) co_return got::closed;
  n = std::get<1>(*read);
  front_.stats_.bytes_received.fetch_add(n);
  co_return got::bytes;
}

asio::awaitable<http_front::connection::got> http_front::connection::read_more(
    deadline_clock::time_point deadline) {
  if (begin_ == end_) begin_ = end_ = 0;
  if (end_ == buffer_.size()) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  std::size_t n = 0;
  const got r =
      co_await read_some(asio::buffer(buffer_.data() + end_, buffer_.size() - end_), deadline, n);
  end_ += n;
  co_return r;
}

asio::awaitable<bool> http_front::connection::send_raw(absl::string_view text) {
  std::optional<std::tuple<asio::error_code, std::size_t>> sent = co_await before(
      deadline_after(front_.limits_.read_timeout),
      asio::async_write(socket_, asio::buffer(text.data(), text.size()), as_tuple_awaitable));
  co_return sent && !std::get<0>(*sent);
}

asio::awaitable<bool> http_front::connection::send(const reply& r) {
  front_.stats_.count_answer(r.code);
  std::uint64_t length = r.json.size();
  for (const auto& b : r.binary) length += b.size();
  std::string head = absl::StrCat("HTTP/1.1 ", r.status, " ", reason(r.status), "\r\n");
  if (length > 0 || r.status != 200) {
    absl::StrAppend(&head, "Content-Type: ",
                    r.binary.empty() ? "application/json" : "application/octet-stream", "\r\n");
  }
  absl::StrAppend(&head, "Content-Length: ", length, "\r\n");
  if (!r.binary.empty()) {
    absl::StrAppend(&head, "Inference-Header-Content-Length: ", r.json.size(), "\r\n");
  }
  if (r.close) absl::StrAppend(&head, "Connection: close\r\n");
  absl::StrAppend(&head, r.headers, "\r\n");
  std::vector<asio::const_buffer> buffers{asio::buffer(head), asio::buffer(r.json)};
  for (const auto& b : r.binary) buffers.push_back(asio::buffer(b.data(), b.size()));
  std::optional<std::tuple<asio::error_code, std::size_t>> sent =
      co_await before(deadline_after(front_.limits_.read_timeout),
                      asio::async_write(socket_, buffers, as_tuple_awaitable));
  if (!sent) front_.stats_.closed_late.fetch_add(1);
  co_return sent && !std::get<0>(*sent);
}

// An endpoint of the protocol, as a request's path names it: the one place
// that knows the paths.
struct http_front::endpoint {
  enum class kind {
    server_metadata,
    health,
    model_metadata,
    model_ready,
    infer,
    shm_status,
    shm_register,
    shm_unregister
  };
  kind what = kind::health;
  absl::string_view method;           // the one it serves
  absl::string_view model, version;   // a model's endpoints; version may be empty
  std::optional<std::string> region;  // shared-memory endpoints that name one

  // The endpoint `path` names, if any:
  //   /v2, /v2/health/{live,ready},
  //   /v2/models/{m}[/versions/{v}][/ready|/infer],
  //   /v2/systemsharedmemory[/region/{r}]/{status,unregister},
  //   /v2/systemsharedmemory/region/{r}/register
  static std::optional<endpoint> of(absl::string_view path) {
    const std::vector<absl::string_view> parts =
        absl::StrSplit(path.substr(path.empty() ? 0 : 1), '/');
    const auto is = [](kind k, absl::string_view method) {
      endpoint e;
      e.what = k;
      e.method = method;
      return e;
    };
    if (parts.empty() || parts[0] != "v2") return std::nullopt;
    if (parts.size() == 1) return is(kind::server_metadata, "GET");
    if (parts[1] == "health") {
      if (parts.size() == 3 && (parts[2] == "live" || parts[2] == "ready")) {
        return is(kind::health, "GET");
      }
      return std::nullopt;
    }
    if (parts[1] == "systemsharedmemory") {
      const bool named = parts.size() == 5 && parts[2] == "region";
      if (parts.size() != 3 && !named) return std::nullopt;
      endpoint e;
      if (parts.back() == "status") {
        e = is(kind::shm_status, "GET");
      } else if (parts.back() == "unregister") {
        e = is(kind::shm_unregister, "POST");
      } else if (named && parts.back() == "register") {
        e = is(kind::shm_register, "POST");
      } else {
        return std::nullopt;
      }
      if (named) e.region = std::string(parts[3]);
      return e;
    }
    if (parts[1] != "models" || parts.size() < 3) return std::nullopt;
    std::size_t i = 3;
    if (parts.size() >= 5 && parts[3] == "versions") i = 5;
    const absl::string_view action = i < parts.size() ? parts[i] : "";
    endpoint e;
    if (i + 1 < parts.size() || (i < parts.size() && action != "ready" && action != "infer")) {
      return std::nullopt;
    }
    if (action.empty()) {
      e = is(kind::model_metadata, "GET");
    } else if (action == "ready") {
      e = is(kind::model_ready, "GET");
    } else {
      e = is(kind::infer, "POST");
    }
    e.model = parts[2];
    if (i == 5) e.version = parts[4];
    return e;
  }
};

std::optional<http_front::reply> http_front::connection::refuse_early(
    const http_head& head, const std::optional<endpoint>& e) const {
  if (!e) {
    return reply::error(absl::NotFoundError(
        absl::StrCat("no endpoint ", kserve::clip(head.path()),
                     " here: the server serves /v2, /v2/health/{live,ready}, "
                     "/v2/models/{model}[/versions/{version}][/ready|/infer] and "
                     "/v2/systemsharedmemory[/region/{name}]/{status,register,unregister}")));
  }
  if (head.method == e->method) return std::nullopt;
  reply r = reply::error(405, absl::StatusCode::kInvalidArgument,
                         absl::StrCat(head.method, " is not served at ", kserve::clip(head.path()),
                                      ": use ", e->method));
  absl::StrAppend(&r.headers, "Allow: ", e->method, "\r\n");
  return r;
}

asio::awaitable<std::optional<http_front::reply>> http_front::connection::read_body(
    std::shared_ptr<std::byte[]>& body, std::uint64_t& length) {
  const http_head& head = parse_.head();
  const server_limits& limits = front_.limits_;
  memory_budget& budget = *front_.budget_;
  const std::string* expect = head.header("expect");
  const bool expect_continue = expect != nullptr && absl::EqualsIgnoreCase(*expect, "100-continue");
  if (expect != nullptr && !expect_continue) {
    co_return reply::error(417, absl::StatusCode::kInvalidArgument,
                           absl::StrCat("Expect: ", kserve::clip(*expect),
                                        " is not served; only Expect: 100-continue"),
                           true);
  }
  std::shared_ptr<budgeted_body> chunked;
  if (head.chunked) {
    chunked = std::make_shared<budgeted_body>();
    chunked->budget = front_.budget_;
  } else {
    length = head.content_length.value_or(0);
    if (length > limits.max_body) {
      co_return reply::error(
          413, absl::StatusCode::kResourceExhausted,
          absl::StrCat("a body of ", length, " bytes is over the server's limit of ",
                       limits.max_body, " bytes (--max_request_mib): send smaller requests"),
          true);
    }
    if (length > budget.limit()) {
      co_return reply::error(413, absl::StatusCode::kResourceExhausted,
                             over_whole_budget(length, budget.limit()).message(), true);
    }
    if (length > limits.connection_budget) {
      front_.stats_.refused_connection_budget.fetch_add(1);
      co_return reply::error(
          413, absl::StatusCode::kResourceExhausted,
          absl::StrCat("a body of ", length, " bytes exceeds the per-connection budget of ",
                       limits.connection_budget,
                       " bytes (--connection_budget_mib): send smaller tensors"),
          true);
    }
    // Room in the budget is taken once the body is on its way: at once when
    // the client waits for 100 Continue, else at its first byte.
    if (length > 0 && !expect_continue && end_ - begin_ <= 1) {
      asio::error_code ec;
      if (socket_.available(ec) == 0 && !ec) {
        std::optional<std::tuple<asio::error_code>> ready =
            co_await before(deadline_after(limits.read_timeout),
                            socket_.async_wait(tcp::socket::wait_read, as_tuple_awaitable));
        if (!ready) {
          front_.stats_.closed_late.fetch_add(1);
          co_return reply::error(
              408, absl::StatusCode::kDeadlineExceeded,
              absl::StrCat("the body did not start within ", limits.read_timeout.count(),
                           " ms (--read_timeout_ms); closing the connection"),
              true);
        }
      }
    }
    if (length > 0) {
      const absl::Status granted = co_await acquire(budget, length);
      if (!granted.ok()) {
        co_return reply::error(413, granted.code(),
                               absl::StrCat("a body of ", length, " bytes: ", granted.message()),
                               true);
      }
      // The binary data after the JSON starts on a 64-byte boundary, so that
      // the first input is imported as a view rather than copied to align
      // it: the JSON's length is known from the head.
      std::uint64_t pad = 0;
      if (const std::string* h = head.header("inference-header-content-length")) {
        pad = (body_alignment - parse_length(*h).value_or(0) % body_alignment) % body_alignment;
      }
      std::shared_ptr<std::byte[]> block =
          front_.pool_.take(length + pad, [b = front_.budget_, length] { b->release(length); });
      body = std::shared_ptr<std::byte[]>(block, block.get() + pad);
      parse_.body_into(body.get());
    }
  }
  if (expect_continue && (length > 0 || head.chunked)) {
    const bool sent = co_await send_raw("HTTP/1.1 100 Continue\r\n\r\n");
    if (!sent) co_return reply::error(503, absl::StatusCode::kUnavailable, "", true);
  }
  parse_.go_on();
  const deadline_clock::time_point deadline = deadline_after(limits.read_timeout);
  while (parse_.at() == http_parse::stage::body) {
    got r = got::bytes;
    if (begin_ < end_) {
      begin_ += parse_.feed(buffer_.data() + begin_, end_ - begin_);
    } else if (!head.chunked && parse_.body_received() < length) {
      // Straight into the body's buffer; the parse then sees it in place.
      const std::uint64_t at = parse_.body_received();
      auto* into = reinterpret_cast<char*>(body.get() + at);
      std::size_t n = 0;
      r = co_await read_some(asio::buffer(into, length - at), deadline, n);
      if (r == got::bytes && parse_.feed(into, n) != n) break;
    } else {
      r = co_await read_more(deadline);
    }
    if (r == got::late) {
      front_.stats_.closed_late.fetch_add(1);
      co_return reply::error(
          408, absl::StatusCode::kDeadlineExceeded,
          absl::StrCat("the body did not arrive within ", limits.read_timeout.count(),
                       " ms (--read_timeout_ms); closing the connection"),
          true);
    }
    if (r == got::closed) co_return reply::error(400, absl::StatusCode::kAborted, "", true);
    if (chunked && parse_.chunked_body().size() > chunked->held) {
      const std::uint64_t more = (parse_.chunked_body().size() - chunked->held + chunked_step - 1) /
                                 chunked_step * chunked_step;
      if (!budget.try_acquire(more)) {
        co_return reply::error(
            429, absl::StatusCode::kResourceExhausted,
            absl::StrCat("a chunked body past ", chunked->held,
                         " bytes finds no more room in the memory budget: send it again later, "
                         "or with a Content-Length"),
            true);
      }
      chunked->held += more;
    }
  }
  if (parse_.at() != http_parse::stage::complete) {
    const int status = parse_.body_too_large() ? 413 : 400;
    co_return reply::error(status, absl::StatusCode::kInvalidArgument,
                           absl::StrCat("malformed body: ", parse_.error(),
                                        parse_.body_too_large() ? " (--max_request_mib)" : ""),
                           true);
  }
  if (chunked) {
    chunked->bytes = std::move(parse_.chunked_body());
    length = chunked->bytes.size();
    body = std::shared_ptr<std::byte[]>(chunked, chunked->bytes.data());
  }
  co_return std::nullopt;
}

asio::awaitable<void> http_front::connection::serve() {
  const server_limits& limits = front_.limits_;
  for (;;) {
    // The head: the idle deadline until its first byte, then the read one.
    deadline_clock::time_point deadline =
        deadline_after(begin_ < end_ ? limits.read_timeout : limits.idle_timeout);
    bool started = begin_ < end_;
    while (parse_.at() == http_parse::stage::head) {
      if (begin_ == end_) {
        const got r = co_await read_more(deadline);
        if (r == got::late && !started) front_.stats_.closed_idle.fetch_add(1);
        if (r == got::late && started) {
          front_.stats_.closed_late.fetch_add(1);
          const reply late = reply::error(
              408, absl::StatusCode::kDeadlineExceeded,
              absl::StrCat("the request's head did not arrive within ", limits.read_timeout.count(),
                           " ms (--read_timeout_ms); closing the connection"),
              true);
          co_await send(late);
        }
        if (r != got::bytes) co_return;
        if (!started) deadline = deadline_after(limits.read_timeout);
        started = true;
      }
      begin_ += parse_.feed(buffer_.data() + begin_, end_ - begin_);
    }
    if (parse_.at() == http_parse::stage::failed) {
      front_.stats_.closed_unframed.fetch_add(1);
      const reply refused =
          reply::error(parse_.head_too_large() ? 431 : 400, absl::StatusCode::kInvalidArgument,
                       absl::StrCat("malformed request: ", parse_.error()), true);
      co_await send(refused);
      co_return;
    }
    const http_head& head = parse_.head();
    const bool has_body = head.chunked || head.content_length.value_or(0) > 0;
    const std::optional<endpoint> e = endpoint::of(head.path());
    std::optional<reply> early = refuse_early(head, e);
    if (early) {
      early->close = early->close || has_body || !head.keep_alive;
      const bool sent = co_await send(*early);
      if (!sent || early->close) co_return;
      parse_.go_on();
      begin_ += parse_.feed(buffer_.data() + begin_, end_ - begin_);
      parse_.next();
      continue;
    }
    std::shared_ptr<std::byte[]> body;
    std::uint64_t length = 0;
    std::optional<reply> refused = co_await read_body(body, length);
    if (refused) {
      if (refused->code != absl::StatusCode::kAborted) co_await send(*refused);
      co_return;
    }
    reply r = co_await front_.route(*e, head, std::move(body), length);
    r.close = r.close || !head.keep_alive;
    const bool sent = co_await send(r);
    if (!sent || r.close) co_return;
    parse_.next();
  }
}

void http_front::serve_connection(tcp::socket socket, connection_limit::slot slot) {
  stats_.connections.fetch_add(1);
  auto shared = std::make_shared<tcp::socket>(std::move(socket));
  const std::uint64_t id = sessions_.track(shared);
  asio::co_spawn(shared->get_executor(), session(shared, id, std::move(slot)), asio::detached);
}

void http_front::refuse_connection(tcp::socket& socket, std::size_t max_connections) {
  const std::string json = kserve::encode_error(
      absl::StrCat("the server holds ", max_connections,
                   " connections at once (--max_connections); this one is closed: connect "
                   "again when others have ended"));
  const std::string text =
      absl::StrCat("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n",
                   "Content-Length: ", json.size(), "\r\nConnection: close\r\n\r\n", json);
  asio::error_code ignored;
  socket.non_blocking(true, ignored);
  socket.write_some(asio::buffer(text), ignored);
}

asio::awaitable<void> http_front::session(std::shared_ptr<tcp::socket> socket, std::uint64_t id,
                                          connection_limit::slot slot) {
  {
    connection c(*this, *socket);
    co_await c.serve();
  }
  asio::error_code ignored;
  socket->shutdown(tcp::socket::shutdown_send, ignored);
  socket->close(ignored);
  {
    const connection_limit::slot closed = std::move(slot);  // its descriptor is free again
  }
  sessions_.untrack(id);
}

asio::awaitable<http_front::reply> http_front::route(const endpoint& e, const http_head& head,
                                                     std::shared_ptr<std::byte[]> body,
                                                     std::uint64_t length) {
  using kind = endpoint::kind;
  switch (e.what) {
    case kind::server_metadata:
      co_return reply::ok(
          kserve::encode_server_metadata("dlasync", DLASYNC_SERVER_VERSION, extensions));
    case kind::health: co_return reply{};
    case kind::shm_status:
    case kind::shm_register:
    case kind::shm_unregister:
      co_return shared_memory(e,
                              absl::string_view(reinterpret_cast<const char*>(body.get()), length));
    default: break;
  }
  absl::StatusOr<const kserve::model_metadata*> m = models_.find(e.model, e.version);
  if (!m.ok()) co_return reply::error(m.status());
  if (e.what == kind::model_metadata) co_return reply::ok(kserve::encode_model_metadata(**m));
  if (e.what == kind::model_ready) co_return reply{};
  reply r = co_await infer(head, e.model, e.version, std::move(body), length);
  co_return r;
}

asio::awaitable<http_front::reply> http_front::infer(const http_head& head, absl::string_view model,
                                                     absl::string_view version,
                                                     std::shared_ptr<std::byte[]> body,
                                                     std::uint64_t length) {
  kserve::request_body request{std::move(body), length, std::nullopt};
  if (const std::string* h = head.header("inference-header-content-length")) {
    request.header_length = parse_length(*h);
    if (!request.header_length) {
      co_return reply::error(absl::InvalidArgumentError(absl::StrCat(
          "Inference-Header-Content-Length is \"", kserve::clip(*h), "\", not a byte count")));
    }
  }
  absl::StatusOr<kserve::infer_request> parsed =
      kserve::parse_infer_request(request, model, version, *budget_);
  request.bytes.reset();  // the inputs keep what they view
  if (!parsed.ok()) co_return reply::error(parsed.status());
  const absl::Status read = kserve::read_inputs(*parsed, shm_, *budget_, pool_);
  if (!read.ok()) co_return reply::error(read);
  absl::StatusOr<kserve::infer_response> answered = co_await models_.infer(*std::move(parsed));
  if (!answered.ok()) co_return reply::error(answered.status());
  const absl::Status written = kserve::write_outputs(*answered, shm_);
  if (!written.ok()) co_return reply::error(written);
  auto kept = std::make_shared<const kserve::infer_response>(*std::move(answered));
  kserve::encoded_response encoded = kserve::encode_infer_response(*kept);
  reply r = reply::ok(std::move(encoded.json));
  r.binary = std::move(encoded.binary);
  r.owner = std::move(kept);
  co_return r;
}

}  // namespace dlasync::examples

namespace dlasync::examples {

http_front::reply http_front::shared_memory(const endpoint& e, absl::string_view body) {
  if (e.what == endpoint::kind::shm_status) {
    absl::StatusOr<std::vector<kserve::shm_region_info>> regions = shm_.status(e.region);
    if (!regions.ok()) return reply::error(regions.status());
    return reply::ok(kserve::encode_shm_status(*regions));
  }
  if (e.what == endpoint::kind::shm_unregister) {
    if (!e.region) {
      if (!shm_.allowed()) return reply::error(shm_.status(std::nullopt).status());
      shm_.remove_all();
      return reply{};
    }
    const absl::Status removed = shm_.remove(*e.region);
    return removed.ok() ? reply{} : reply::error(removed);
  }
  absl::StatusOr<kserve::shm_region_info> info = kserve::parse_shm_register(body, *e.region);
  if (!info.ok()) return reply::error(info.status());
  const absl::Status added = shm_.add(info->name, info->key, info->offset, info->byte_size);
  return added.ok() ? reply{} : reply::error(added);
}

}  // namespace dlasync::examples
