// Numeric IPv4 and IPv6 addresses (internal), as descriptors carry them:
// parsed once here for the descriptor's encoding, the connection's socket
// address, and the listener's checks.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>

namespace dlasync::remote_detail {

struct numeric_address {
  bool v4 = false;
  std::array<unsigned char, 16> bytes{};  // network order; the first 4 for IPv4
  std::size_t length() const noexcept { return v4 ? 4 : 16; }
};

// `text` as inet_pton reads it (IPv4 first), or nullopt when it is no
// numeric address.
std::optional<numeric_address> parse_address(const std::string& text);

// Whether `address` is a numeric IPv4 or IPv6 address, and whether it is
// the wildcard (0.0.0.0, ::, ::ffff:0.0.0.0), which a listener binds to
// serve every interface but which names no host to connect to.
bool is_numeric_address(const std::string& address);
bool is_wildcard_address(const std::string& address);
// A numeric address as a decoded descriptor spells it (inet_ntop's text:
// "2001:DB8::1" is "2001:db8::1"); anything else as it is.
std::string canonical_address(const std::string& address);

}  // namespace dlasync::remote_detail
