#include "remote/src/numeric_address.hpp"

#include <arpa/inet.h>

#include <algorithm>

namespace dlasync::remote_detail {

std::optional<numeric_address> parse_address(const std::string& text) {
  numeric_address a;
  a.v4 = inet_pton(AF_INET, text.c_str(), a.bytes.data()) == 1;
  if (!a.v4 && inet_pton(AF_INET6, text.c_str(), a.bytes.data()) != 1) return std::nullopt;
  return a;
}

bool is_numeric_address(const std::string& address) {
  return parse_address(address).has_value();
}

bool is_wildcard_address(const std::string& address) {
  const std::optional<numeric_address> a = parse_address(address);
  if (!a) return false;
  const auto zero = [&](std::size_t from, std::size_t to) {
    return std::all_of(a->bytes.begin() + static_cast<std::ptrdiff_t>(from),
                       a->bytes.begin() + static_cast<std::ptrdiff_t>(to),
                       [](unsigned char b) { return b == 0; });
  };
  if (a->v4) return zero(0, 4);
  // ::, or 0.0.0.0 mapped into IPv6 (::ffff:0.0.0.0), which Linux routes as
  // 0.0.0.0.
  const bool mapped = zero(0, 10) && a->bytes[10] == 0xff && a->bytes[11] == 0xff;
  return mapped ? zero(12, 16) : zero(0, 16);
}

std::string canonical_address(const std::string& address) {
  const std::optional<numeric_address> a = parse_address(address);
  char text[INET6_ADDRSTRLEN] = {};
  if (!a || inet_ntop(a->v4 ? AF_INET : AF_INET6, a->bytes.data(), text, sizeof(text)) == nullptr) {
    return address;
  }
  return text;
}

}  // namespace dlasync::remote_detail
