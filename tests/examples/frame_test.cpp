#include "frame.hpp"

#include <cstring>

#include "catch2/catch.hpp"
#include "support/test_tensors.hpp"

namespace dlasync::examples {
namespace {

using dlasync::testing::require_status;

std::vector<std::byte> body_of(const std::vector<std::byte>& frame) {
  return {frame.begin() + frame_header_bytes, frame.end()};
}

std::vector<std::byte> floats(std::size_t n) {
  return std::vector<std::byte>(n * 4, std::byte{7});
}

const std::vector<std::int64_t> shape_4x8{4, 8};
const std::vector<std::int64_t> compact_4x8{8, 1};

TEST_CASE("a request frame round-trips through encode and parse", "[examples][frame]") {
  const std::vector<std::int64_t> strides{1, 4};  // transposed
  const auto frame = encode_request(42, dtypes::float32, shape_4x8, strides, floats(32));
  std::array<std::byte, frame_header_bytes> header;
  std::memcpy(header.data(), frame.data(), header.size());
  absl::StatusOr<std::uint32_t> length = read_frame_header(header, request_magic, 1 << 20);
  REQUIRE(length.ok());
  CHECK(*length == frame.size() - frame_header_bytes);

  absl::StatusOr<request> r = parse_request(body_of(frame));
  REQUIRE(r.ok());
  CHECK(r->id == 42);
  CHECK(r->type == dtypes::float32);
  CHECK(r->shape == shape_4x8);
  CHECK(r->strides == strides);
  CHECK(r->payload_bytes == 128);
  CHECK(r->payload_offset == request_fixed_bytes + 32);
}

TEST_CASE("a response frame round-trips, with the sum or with the message", "[examples][frame]") {
  const auto ok = encode_response({7, absl::StatusCode::kOk, 12.5, 32, "cuda:0"});
  absl::StatusOr<response> r = parse_response(body_of(ok));
  REQUIRE(r.ok());
  CHECK(r->id == 7);
  CHECK(r->sum == 12.5);
  CHECK(r->count == 32);
  CHECK(r->text == "cuda:0");

  const auto error = encode_response({8, absl::StatusCode::kInvalidArgument, 0, 0, "bad dtype"});
  r = parse_response(body_of(error));
  REQUIRE(r.ok());
  CHECK(r->code == absl::StatusCode::kInvalidArgument);
  CHECK(r->text == "bad dtype");
}

TEST_CASE("a header with the wrong magic or an oversized body is refused", "[examples][frame]") {
  auto frame = encode_request(1, dtypes::float32, shape_4x8, compact_4x8, floats(32));
  std::array<std::byte, frame_header_bytes> header;
  std::memcpy(header.data(), frame.data(), header.size());
  require_status(read_frame_header(header, request_magic, 64).status(),
                 absl::StatusCode::kOutOfRange, {"frame body of 176 bytes", "limit of 64"});
  header[0] = std::byte{'G'};
  require_status(read_frame_header(header, request_magic, 1 << 20).status(),
                 absl::StatusCode::kInvalidArgument, {"magic", "not framed"});
}

TEST_CASE("malformed request bodies get specific errors", "[examples][frame]") {
  SECTION("shorter than the fixed fields") {
    const std::vector<std::byte> body(15);
    require_status(parse_request(body).status(), absl::StatusCode::kInvalidArgument,
                   {"15 bytes", "shorter"});
    CHECK(peek_request_id(body) == 0);
  }
  SECTION("an unknown dtype code") {
    const auto frame = encode_request(3, dtype{99, 32, 1}, shape_4x8, compact_4x8, floats(32));
    require_status(parse_request(body_of(frame)).status(), absl::StatusCode::kInvalidArgument,
                   {"dtype", "99"});
    CHECK(peek_request_id(body_of(frame)) == 3);
  }
  SECTION("a sub-byte dtype") {
    const auto frame = encode_request(3, dtypes::float4_e2m1fn, shape_4x8, compact_4x8, floats(4));
    require_status(parse_request(body_of(frame)).status(), absl::StatusCode::kInvalidArgument,
                   {"float4_e2m1fn", "byte-sized"});
  }
  SECTION("a payload one element short") {
    const auto frame = encode_request(3, dtypes::float32, shape_4x8, compact_4x8, floats(31));
    require_status(parse_request(body_of(frame)).status(), absl::StatusCode::kInvalidArgument,
                   {"payload of 124 bytes", "128 bytes"});
  }
  SECTION("extents whose size overflows") {
    const std::vector<std::int64_t> huge{std::int64_t{1} << 40, std::int64_t{1} << 40};
    const std::vector<std::int64_t> strides{std::int64_t{1} << 40, 1};
    const auto frame = encode_request(3, dtypes::float32, huge, strides, {});
    require_status(parse_request(body_of(frame)).status(), absl::StatusCode::kOutOfRange,
                   {"overflows"});
  }
  SECTION("negative extents or strides") {
    const std::vector<std::int64_t> negative{4, -1};
    const auto frame = encode_request(3, dtypes::float32, shape_4x8, negative, floats(32));
    require_status(parse_request(body_of(frame)).status(), absl::StatusCode::kInvalidArgument,
                   {"dimension 1", "stride -1", ">= 0"});
  }
  SECTION("ndim above the limit") {
    const std::vector<std::int64_t> many(max_frame_ndim + 1, 1);
    const auto frame = encode_request(3, dtypes::float32, many, many, floats(1));
    require_status(parse_request(body_of(frame)).status(), absl::StatusCode::kInvalidArgument,
                   {"ndim 17", "limit of 16"});
  }
  SECTION("shape and strides cut short") {
    auto body = body_of(encode_request(3, dtypes::float32, shape_4x8, compact_4x8, {}));
    body.resize(body.size() - 12);
    require_status(parse_request(body).status(), absl::StatusCode::kInvalidArgument,
                   {"no room", "ndim 2"});
  }
  SECTION("an unknown operation or nonzero reserved bytes") {
    auto body = body_of(encode_request(3, dtypes::float32, shape_4x8, compact_4x8, floats(32)));
    body[13] = std::byte{5};
    require_status(parse_request(body).status(), absl::StatusCode::kInvalidArgument,
                   {"operation 5"});
    body[13] = std::byte{0};
    body[14] = std::byte{1};
    require_status(parse_request(body).status(), absl::StatusCode::kInvalidArgument, {"reserved"});
  }
}

TEST_CASE("payload sizes follow shape and strides, with broadcast and empty tensors",
          "[examples][frame]") {
  const std::vector<std::int64_t> broadcast{0, 1};
  CHECK(payload_bytes_for(dtypes::float64, shape_4x8, broadcast) == 64);
  const std::vector<std::int64_t> empty{0, 8};
  CHECK(payload_bytes_for(dtypes::float64, empty, compact_4x8) == 0);
  const std::vector<std::int64_t> none;
  CHECK(payload_bytes_for(dtypes::int8, none, none) == 1);  // a scalar
  const std::vector<std::int64_t> big{std::int64_t{1} << 62, 2};
  CHECK_FALSE(payload_bytes_for(dtypes::float64, big, compact_4x8).has_value());
}

}  // namespace
}  // namespace dlasync::examples
