// The inference server's wire format: length-prefixed binary frames.
//
// All integers are little-endian. A request frame is
//
//   offset  size  field
//   0       4     magic "DLQ1"
//   4       4     body length B (bytes after this field)
//   8       8     request id (echoed in the response)
//   16      1     dtype code (DLPack's DLDataTypeCode)
//   17      1     dtype bits
//   18      2     dtype lanes (1)
//   20      1     ndim (0 to max_frame_ndim)
//   21      1     operation (0: sum of all elements)
//   22      2     reserved, 0
//   24      8*n   shape, int64 each, >= 0
//   24+8n   8*n   strides in elements, int64 each, >= 0
//   24+16n  rest  payload: the elements that shape and strides reach, from
//                 the first one (offset 0) to the last one
//
// A response frame is
//
//   0       4     magic "DLR1"
//   4       4     body length
//   8       8     request id (0 when the request's id could not be read)
//   16      4     status code (absl::StatusCode: 0 OK, 3 InvalidArgument, ...)
//   20      4     reserved, 0
//   OK:     8     sum (float64), then 8: element count (int64), then the
//                 rest: the device the sum ran on, as text ("cuda:0")
//   else:   rest  the error message, as text
//
// The parser reads nothing it has not checked the size of, and reports each
// malformed frame with a specific status.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dlasync/dlasync.hpp"

namespace dlasync::examples {

inline constexpr std::uint32_t request_magic = 0x31514C44;   // "DLQ1"
inline constexpr std::uint32_t response_magic = 0x31524C44;  // "DLR1"
inline constexpr std::size_t frame_header_bytes = 8;
inline constexpr std::size_t request_fixed_bytes = 16;  // id, dtype, ndim, op, reserved
inline constexpr int max_frame_ndim = 16;

enum class frame_op : std::uint8_t { sum = 0 };

struct request {
  std::uint64_t id = 0;
  dtype type;
  frame_op op = frame_op::sum;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::size_t payload_offset = 0;  // within the body
  std::size_t payload_bytes = 0;
};

// The body length of a frame whose first 8 bytes are `header`.
//   InvalidArgument  wrong magic: the stream is not framed as requests, and
//                    the connection cannot find the next frame;
//   OutOfRange       a body longer than `max_body` bytes.
absl::StatusOr<std::uint32_t> read_frame_header(
    std::span<const std::byte, frame_header_bytes> header, std::uint32_t expected_magic,
    std::uint32_t max_body);

// The request in `body` (the bytes after the header). The payload is not
// read, only located.
//   InvalidArgument  a body too short for its fields, ndim above
//                    max_frame_ndim, nonzero reserved bytes, an unknown op,
//                    negative extents or strides, a dtype DLPack does not
//                    define or that is not byte-sized, or a payload whose
//                    size does not match what shape and strides reach;
//   OutOfRange       a tensor whose size overflows 64 bits.
absl::StatusOr<request> parse_request(std::span<const std::byte> body);

// The request id of a body too malformed to parse, or 0.
std::uint64_t peek_request_id(std::span<const std::byte> body) noexcept;

// The bytes a payload of `type` with `shape` and `strides` must have; empty
// on overflow or negative values.
std::optional<std::uint64_t> payload_bytes_for(dtype type, std::span<const std::int64_t> shape,
                                               std::span<const std::int64_t> strides) noexcept;

// A whole request frame.
std::vector<std::byte> encode_request(std::uint64_t id, dtype type,
                                      std::span<const std::int64_t> shape,
                                      std::span<const std::int64_t> strides,
                                      std::span<const std::byte> payload);

struct response {
  std::uint64_t id = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  double sum = 0;
  std::int64_t count = 0;
  std::string text;  // the device on success, the message otherwise
};

// A whole response frame.
std::vector<std::byte> encode_response(const response& r);

// The response in `body`; InvalidArgument when malformed.
absl::StatusOr<response> parse_response(std::span<const std::byte> body);

}  // namespace dlasync::examples
