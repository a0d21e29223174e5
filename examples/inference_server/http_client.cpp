#include "http_client.hpp"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "asio/experimental/as_tuple.hpp"
#include "asio/use_awaitable.hpp"
#include "asio/write.hpp"

namespace dlasync::examples {
namespace {

constexpr auto as_tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

http_client& self_of(http_parser* p) {
  return *static_cast<http_client*>(p->data);
}

}  // namespace

std::optional<absl::string_view> http_response::header(absl::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return absl::string_view(v);
  }
  return std::nullopt;
}

std::string http_post(absl::string_view target, absl::string_view extra, absl::string_view host,
                      std::span<const std::byte> json, std::span<const std::byte> binary) {
  std::string out = absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: ", host,
                                 "\r\nContent-Type: application/octet-stream\r\nContent-Length: ",
                                 json.size() + binary.size(), "\r\n", extra, "\r\n");
  out.append(reinterpret_cast<const char*>(json.data()), json.size());
  out.append(reinterpret_cast<const char*>(binary.data()), binary.size());
  return out;
}

http_client::http_client(asio::ip::tcp::socket& socket) : socket_(socket), buffer_(64 << 10) {
  http_parser_init(&parser_, HTTP_RESPONSE);
  parser_.data = this;
  http_parser_settings_init(&settings_);
  settings_.on_header_field = &http_client::on_header_field;
  settings_.on_header_value = &http_client::on_header_value;
  settings_.on_body = &http_client::on_body;
  settings_.on_message_complete = &http_client::on_message_complete;
}

int http_client::on_header_field(http_parser* p, const char* at, std::size_t n) {
  http_client& c = self_of(p);
  if (c.field_next_) {
    c.current_.headers.emplace_back();
    c.field_next_ = false;
  }
  c.current_.headers.back().first.append(at, n);
  return 0;
}

int http_client::on_header_value(http_parser* p, const char* at, std::size_t n) {
  http_client& c = self_of(p);
  if (c.current_.headers.empty()) return 1;
  c.current_.headers.back().second.append(at, n);
  c.field_next_ = true;
  return 0;
}

int http_client::on_body(http_parser* p, const char* at, std::size_t n) {
  http_client& c = self_of(p);
  if (c.current_.body.size() + n > c.max_body_) {
    c.too_large_ = true;
    return 1;
  }
  c.current_.body.append(at, n);
  return 0;
}

int http_client::on_message_complete(http_parser* p) {
  http_client& c = self_of(p);
  c.complete_ = true;
  c.current_.status = static_cast<int>(p->status_code);
  c.current_.keep_alive = http_should_keep_alive(p) != 0;
  // Stop at the message's end: the bytes after it are the next response's.
  http_parser_pause(p, 1);
  return 0;
}

asio::awaitable<absl::Status> http_client::send(std::span<const std::byte> bytes) {
  auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(bytes.data(), bytes.size()),
                                            as_tuple_awaitable);
  if (ec) co_return absl::UnavailableError(absl::StrCat("send failed: ", ec.message()));
  co_return absl::OkStatus();
}

asio::awaitable<absl::StatusOr<http_response>> http_client::receive(std::size_t max_body) {
  current_ = http_response{};
  field_next_ = true;
  complete_ = false;
  too_large_ = false;
  max_body_ = max_body;
  for (;;) {
    if (start_ < end_) {
      const std::size_t n =
          http_parser_execute(&parser_, &settings_, buffer_.data() + start_, end_ - start_);
      start_ += n;
      const auto err = static_cast<http_errno>(parser_.http_errno);
      if (complete_) {
        http_parser_pause(&parser_, 0);
        for (auto& [name, value] : current_.headers) name = absl::AsciiStrToLower(name);
        co_return std::move(current_);
      }
      if (too_large_) {
        co_return absl::InvalidArgumentError(
            absl::StrCat("a response body past ", max_body, " bytes"));
      }
      if (err != HPE_OK) {
        co_return absl::InvalidArgumentError(
            absl::StrCat("a response that is not HTTP: ", http_errno_description(err)));
      }
    }
    if (start_ == end_) start_ = end_ = 0;
    if (end_ == buffer_.size()) {
      // Unparsed bytes at the end: move them to the front, or grow.
      std::copy(buffer_.begin() + static_cast<std::ptrdiff_t>(start_),
                buffer_.begin() + static_cast<std::ptrdiff_t>(end_), buffer_.begin());
      end_ -= start_;
      start_ = 0;
      if (end_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);
    }
    auto [ec, n] = co_await socket_.async_read_some(
        asio::buffer(buffer_.data() + end_, buffer_.size() - end_), as_tuple_awaitable);
    if (ec) {
      // A body that runs to the connection's end is complete there.
      http_parser_execute(&parser_, &settings_, nullptr, 0);
      if (complete_) {
        http_parser_pause(&parser_, 0);
        for (auto& [name, value] : current_.headers) name = absl::AsciiStrToLower(name);
        co_return std::move(current_);
      }
      co_return absl::UnavailableError(
          absl::StrCat("the connection ended before the response: ", ec.message()));
    }
    end_ += n;
  }
}

}  // namespace dlasync::examples
