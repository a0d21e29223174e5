#include "frame.hpp"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dlasync::examples {
namespace {

template <typename T>
T load(const std::byte* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void append(std::vector<std::byte>& out, T v) {
  // resize + memcpy rather than insert: GCC 12 at -O3 misreads the insert
  // as an overflow (-Wstringop-overflow).
  const std::size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}

void append_bytes(std::vector<std::byte>& out, std::span<const std::byte> bytes) {
  out.insert(out.end(), bytes.begin(), bytes.end());
}

// Fills in the body length of a frame built in `out`.
void seal(std::vector<std::byte>& out) {
  const auto body = static_cast<std::uint32_t>(out.size() - frame_header_bytes);
  std::memcpy(out.data() + 4, &body, sizeof body);
}

}  // namespace

absl::StatusOr<std::uint32_t> read_frame_header(
    std::span<const std::byte, frame_header_bytes> header, std::uint32_t expected_magic,
    std::uint32_t max_body) {
  const auto magic = load<std::uint32_t>(header.data());
  if (magic != expected_magic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "frame magic 0x%08x is not 0x%08x: the stream is not framed as dlasync messages; "
        "start each frame with the magic and the body length",
        magic, expected_magic));
  }
  const auto body = load<std::uint32_t>(header.data() + 4);
  if (body > max_body) {
    return absl::OutOfRangeError(absl::StrCat("frame body of ", body,
                                              " bytes exceeds the limit of ", max_body,
                                              " bytes; send smaller tensors"));
  }
  return body;
}

std::optional<std::uint64_t> payload_bytes_for(dtype type, std::span<const std::int64_t> shape,
                                               std::span<const std::int64_t> strides) noexcept {
  if (type.bits % 8 != 0 || shape.size() != strides.size()) return std::nullopt;
  std::uint64_t last = 0;  // offset of the last element, in elements
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || strides[i] < 0) return std::nullopt;
    if (shape[i] == 0) return 0;
  }
  for (std::size_t i = 0; i < shape.size(); ++i) {
    std::uint64_t reach = 0;
    if (__builtin_mul_overflow(static_cast<std::uint64_t>(shape[i] - 1),
                               static_cast<std::uint64_t>(strides[i]), &reach) ||
        __builtin_add_overflow(last, reach, &last)) {
      return std::nullopt;
    }
  }
  std::uint64_t bytes = 0;
  if (__builtin_add_overflow(last, 1, &last) ||
      __builtin_mul_overflow(last, std::uint64_t{type.padded_size()}, &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

std::uint64_t peek_request_id(std::span<const std::byte> body) noexcept {
  return body.size() >= 8 ? load<std::uint64_t>(body.data()) : 0;
}

absl::StatusOr<request> parse_request(std::span<const std::byte> body) {
  if (body.size() < request_fixed_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("request body of ", body.size(),
                                                   " bytes is shorter than its ",
                                                   request_fixed_bytes, " fixed bytes"));
  }
  request r;
  r.id = load<std::uint64_t>(body.data());
  r.type = dtype{load<std::uint8_t>(body.data() + 8), load<std::uint8_t>(body.data() + 9),
                 load<std::uint16_t>(body.data() + 10)};
  const int ndim = load<std::uint8_t>(body.data() + 12);
  const auto op = load<std::uint8_t>(body.data() + 13);
  const auto reserved = load<std::uint16_t>(body.data() + 14);
  if (ndim > max_frame_ndim) {
    return absl::InvalidArgumentError(
        absl::StrCat("ndim ", ndim, " is above this server's limit of ", max_frame_ndim));
  }
  if (op != static_cast<std::uint8_t>(frame_op::sum)) {
    return absl::InvalidArgumentError(
        absl::StrCat("operation ", op, " is unknown; 0 (sum) is the only one"));
  }
  if (reserved != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reserved bytes are ", reserved, ", not 0: a newer protocol version?"));
  }
  const std::size_t dims_bytes = 16 * static_cast<std::size_t>(ndim);
  if (body.size() - request_fixed_bytes < dims_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request body of ", body.size(), " bytes has no room for the shape and strides of ndim ",
        ndim, " (", request_fixed_bytes + dims_bytes, " bytes)"));
  }
  if (absl::Status s = check_dtype(r.type, 0); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("dtype: ", s.message()));
  }
  if (r.type.bits % 8 != 0 || r.type.lanes != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype ", r.type.name(), " is not carried by this protocol: send byte-sized scalars"));
  }
  const std::byte* dims = body.data() + request_fixed_bytes;
  for (int i = 0; i < ndim; ++i) {
    r.shape.push_back(load<std::int64_t>(dims + std::ptrdiff_t{8} * i));
    r.strides.push_back(load<std::int64_t>(dims + std::ptrdiff_t{8} * (ndim + i)));
    if (r.shape.back() < 0 || r.strides.back() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("dimension ", i, " has extent ",
                                                     r.shape.back(), " and stride ",
                                                     r.strides.back(), "; both must be >= 0"));
    }
  }
  const std::optional<std::uint64_t> expected = payload_bytes_for(r.type, r.shape, r.strides);
  if (!expected) {
    return absl::OutOfRangeError("the tensor that shape and strides describe overflows 64 bits");
  }
  r.payload_offset = request_fixed_bytes + dims_bytes;
  r.payload_bytes = body.size() - r.payload_offset;
  if (r.payload_bytes != *expected) {
    return absl::InvalidArgumentError(absl::StrCat("payload of ", r.payload_bytes,
                                                   " bytes does not match the ", *expected,
                                                   " bytes that shape and strides reach"));
  }
  return r;
}

std::vector<std::byte> encode_request(std::uint64_t id, dtype type,
                                      std::span<const std::int64_t> shape,
                                      std::span<const std::int64_t> strides,
                                      std::span<const std::byte> payload) {
  std::vector<std::byte> out;
  out.reserve(frame_header_bytes + request_fixed_bytes + 16 * shape.size() + payload.size());
  append(out, request_magic);
  append(out, std::uint32_t{0});
  append(out, id);
  append(out, type.code);
  append(out, type.bits);
  append(out, type.lanes);
  append(out, static_cast<std::uint8_t>(shape.size()));
  append(out, static_cast<std::uint8_t>(frame_op::sum));
  append(out, std::uint16_t{0});
  for (std::int64_t e : shape) append(out, e);
  for (std::int64_t s : strides) append(out, s);
  append_bytes(out, payload);
  seal(out);
  return out;
}

std::vector<std::byte> encode_response(const response& r) {
  std::vector<std::byte> out;
  append(out, response_magic);
  append(out, std::uint32_t{0});
  append(out, r.id);
  append(out, static_cast<std::uint32_t>(r.code));
  append(out, std::uint32_t{0});
  if (r.code == absl::StatusCode::kOk) {
    append(out, r.sum);
    append(out, r.count);
  }
  append_bytes(out, std::as_bytes(std::span(r.text.data(), r.text.size())));
  seal(out);
  return out;
}

absl::StatusOr<response> parse_response(std::span<const std::byte> body) {
  if (body.size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("response body of ", body.size(), " bytes is shorter than 16"));
  }
  response r;
  r.id = load<std::uint64_t>(body.data());
  r.code = static_cast<absl::StatusCode>(load<std::uint32_t>(body.data() + 8));
  std::size_t text = 16;
  if (r.code == absl::StatusCode::kOk) {
    if (body.size() < 32) {
      return absl::InvalidArgumentError(
          absl::StrCat("OK response body of ", body.size(), " bytes has no room for the sum"));
    }
    r.sum = load<double>(body.data() + 16);
    r.count = load<std::int64_t>(body.data() + 24);
    text = 32;
  }
  r.text.assign(reinterpret_cast<const char*>(body.data() + text), body.size() - text);
  return r;
}

}  // namespace dlasync::examples
