#include "http_parse.hpp"

#include <algorithm>
#include <cstring>

namespace dlasync::examples {
namespace {

http_parse& self(http_parser* p) {
  return *static_cast<http_parse*>(p->data);
}

char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

}  // namespace

absl::string_view http_head::path() const {
  const absl::string_view t = target;
  return t.substr(0, t.find('?'));
}

const std::string* http_head::header(absl::string_view name) const {
  for (const auto& [field, value] : headers) {
    if (field == name) return &value;
  }
  return nullptr;
}

http_parse::http_parse(std::size_t max_head_bytes, std::uint64_t max_chunked_body)
    : max_head_bytes_(max_head_bytes), max_chunked_body_(max_chunked_body) {
  http_parser_init(&parser_, HTTP_REQUEST);
  parser_.data = this;
  http_parser_settings_init(&settings_);
  settings_.on_url = &http_parse::on_url;
  settings_.on_header_field = &http_parse::on_header_field;
  settings_.on_header_value = &http_parse::on_header_value;
  settings_.on_headers_complete = &http_parse::on_headers_complete;
  settings_.on_body = &http_parse::on_body;
  settings_.on_message_complete = &http_parse::on_message_complete;
}

std::size_t http_parse::feed(const char* data, std::size_t size) {
  if (stage_ != stage::head && stage_ != stage::body) return 0;
  const bool in_head = stage_ == stage::head;
  const std::size_t n = http_parser_execute(&parser_, &settings_, data, size);
  if (in_head) head_bytes_ += n;
  const auto err = HTTP_PARSER_ERRNO(&parser_);
  if (err != HPE_OK && err != HPE_PAUSED) {
    stage_ = stage::failed;
    if (body_too_large_) {
      error_ = "the chunked body is larger than the server takes";
    } else {
      error_ = std::string(http_errno_name(err)) + ": " + http_errno_description(err);
    }
    return n;
  }
  if (in_head && head_bytes_ > max_head_bytes_) {
    stage_ = stage::failed;
    head_too_large_ = true;
    error_ = "the request's head (line and headers) is larger than the server takes";
  }
  return n;
}

void http_parse::go_on() {
  stage_ = stage::body;
  http_parser_pause(&parser_, 0);
}

void http_parse::next() {
  head_ = http_head{};
  stage_ = stage::head;
  in_value_ = false;
  head_bytes_ = 0;
  body_at_ = nullptr;
  body_received_ = 0;
  chunked_.clear();
  http_parser_pause(&parser_, 0);
}

int http_parse::on_url(http_parser* p, const char* at, std::size_t n) {
  self(p).head_.target.append(at, n);
  return 0;
}

int http_parse::on_header_field(http_parser* p, const char* at, std::size_t n) {
  http_parse& s = self(p);
  if (s.in_value_ || s.head_.headers.empty()) s.head_.headers.emplace_back();
  s.in_value_ = false;
  std::string& field = s.head_.headers.back().first;
  for (std::size_t i = 0; i < n; ++i) field.push_back(lower(at[i]));
  return 0;
}

int http_parse::on_header_value(http_parser* p, const char* at, std::size_t n) {
  http_parse& s = self(p);
  s.in_value_ = true;
  s.head_.headers.back().second.append(at, n);
  return 0;
}

int http_parse::on_headers_complete(http_parser* p) {
  http_parse& s = self(p);
  for (auto& [field, value] : s.head_.headers) {
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.pop_back();
  }
  s.head_.method = http_method_str(static_cast<http_method>(p->method));
  s.head_.chunked = (p->flags & F_CHUNKED) != 0;
  if ((p->flags & F_CONTENTLENGTH) != 0) s.head_.content_length = p->content_length;
  s.head_.keep_alive = http_should_keep_alive(p) != 0;
  s.stage_ = stage::head_done;
  http_parser_pause(p, 1);
  return 0;
}

int http_parse::on_body(http_parser* p, const char* at, std::size_t n) {
  http_parse& s = self(p);
  if (s.head_.chunked) {
    if (s.chunked_.size() + n > s.max_chunked_body_) {
      s.body_too_large_ = true;
      return 1;
    }
    const auto* b = reinterpret_cast<const std::byte*>(at);
    s.chunked_.insert(s.chunked_.end(), b, b + n);
    return 0;
  }
  if (s.body_at_ == nullptr) return 1;  // the server did not say where
  std::byte* to = s.body_at_ + s.body_received_;
  if (reinterpret_cast<const std::byte*>(at) != to) std::memcpy(to, at, n);
  s.body_received_ += n;
  return 0;
}

int http_parse::on_message_complete(http_parser* p) {
  http_parse& s = self(p);
  s.stage_ = stage::complete;
  http_parser_pause(p, 1);
  return 0;
}

}  // namespace dlasync::examples
