// The inference server's UCX transport on the wire: the Open Inference
// Protocol's gRPC messages (grpc_service.proto), each carried as one UCX
// active message with a small header of the transport's own. All integers
// are little-endian.
//
// A request is an active message with id `ucx_request_am`, sent with
// UCP_AM_SEND_FLAG_REPLY (the server answers on the endpoint UCX gives it);
// its header is 16 bytes:
//
//   offset  size  field
//   0       4     magic "KV2Q"
//   4       4     reserved, 0
//   8       8     tag: the client's, returned in the response
//
// and its data is a serialized `inference.ModelInferRequest`, carried eagerly
// when small and by rendezvous when large (UCX's choice, or the sender's).
//
// A response is an active message with id `ucx_response_am`; its header is
// 16 bytes:
//
//   0       4     magic "KV2R"
//   4       4     status code (absl::StatusCode, which gRPC's codes equal)
//   8       8     the request's tag (0 when its header could not be read)
//
// and its data is a serialized `inference.ModelInferResponse` when the code
// is OK (0), else the error message, as text.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace dlasync::examples {

inline constexpr unsigned ucx_request_am = 0x51;
inline constexpr unsigned ucx_response_am = 0x52;
inline constexpr std::uint32_t ucx_request_magic = 0x5132564B;   // "KV2Q"
inline constexpr std::uint32_t ucx_response_magic = 0x5232564B;  // "KV2R"
inline constexpr std::size_t ucx_header_bytes = 16;
// The fields are copied in the host's order, which the wire's must be.
static_assert(std::endian::native == std::endian::little, "the UCX header is little-endian");

// The 16 header bytes of either direction: a magic, a word (reserved in a
// request, the status code in a response) and the tag.
struct ucx_header {
  std::uint32_t magic = 0;
  std::uint32_t word = 0;
  std::uint64_t tag = 0;

  std::array<std::byte, ucx_header_bytes> encode() const noexcept {
    std::array<std::byte, ucx_header_bytes> out{};
    std::memcpy(out.data(), &magic, 4);
    std::memcpy(out.data() + 4, &word, 4);
    std::memcpy(out.data() + 8, &tag, 8);
    return out;
  }
  // The header in `bytes`; empty unless they are exactly 16 bytes.
  static std::optional<ucx_header> decode(std::span<const std::byte> bytes) noexcept {
    if (bytes.size() != ucx_header_bytes) return std::nullopt;
    ucx_header h;
    std::memcpy(&h.magic, bytes.data(), 4);
    std::memcpy(&h.word, bytes.data() + 4, 4);
    std::memcpy(&h.tag, bytes.data() + 8, 8);
    return h;
  }
};

inline ucx_header ucx_request_header(std::uint64_t tag) noexcept {
  return {ucx_request_magic, 0, tag};
}
inline ucx_header ucx_response_header(std::uint64_t tag, absl::StatusCode code) noexcept {
  return {ucx_response_magic, static_cast<std::uint32_t>(code), tag};
}

// A request's bytes as one buffer: the header with `tag`, then `message`
// (the active message's header is its first ucx_header_bytes).
inline std::vector<std::byte> ucx_request_bytes(std::uint64_t tag,
                                                std::span<const std::byte> message) {
  const auto header = ucx_request_header(tag).encode();
  std::vector<std::byte> bytes(header.size() + message.size());
  std::memcpy(bytes.data(), header.data(), header.size());
  // (memcpy takes no null pointer, which an empty span may give.)
  if (!message.empty()) std::memcpy(bytes.data() + header.size(), message.data(), message.size());
  return bytes;
}

}  // namespace dlasync::examples
