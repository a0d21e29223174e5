#include "dlasync/dtype.hpp"

#include "catch2/catch.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using testing::require_status;

struct valid_case {
  std::uint8_t code;
  std::uint8_t bits;
  const char* name;
};

constexpr valid_case valid[] = {
    {0, 8, "int8"},
    {0, 16, "int16"},
    {0, 32, "int32"},
    {0, 64, "int64"},
    {1, 8, "uint8"},
    {1, 16, "uint16"},
    {1, 32, "uint32"},
    {1, 64, "uint64"},
    {2, 16, "float16"},
    {2, 32, "float32"},
    {2, 64, "float64"},
    {4, 16, "bfloat16"},
    {5, 64, "complex64"},
    {5, 128, "complex128"},
    {6, 8, "bool"},
    {7, 8, "float8_e3m4"},
    {8, 8, "float8_e4m3"},
    {9, 8, "float8_e4m3b11fnuz"},
    {10, 8, "float8_e4m3fn"},
    {11, 8, "float8_e4m3fnuz"},
    {12, 8, "float8_e5m2"},
    {13, 8, "float8_e5m2fnuz"},
    {14, 8, "float8_e8m0fnu"},
    {15, 6, "float6_e2m3fn"},
    {16, 6, "float6_e3m2fn"},
    {17, 4, "float4_e2m1fn"},
};

}  // namespace

TEST_CASE("every DLPack type code with its valid widths is accepted", "[transfer][dtype]") {
  for (const valid_case& c : valid) {
    const dtype t{c.code, c.bits, 1};
    INFO(c.name);
    CHECK(check_dtype(t, 0).ok());
    CHECK(t.name() == c.name);
  }
}

TEST_CASE("bits not valid for the type code are refused", "[transfer][dtype]") {
  require_status(check_dtype({2, 8, 1}, 0), absl::StatusCode::kInvalidArgument,
                 {"code 2 (float)", "8 bits", "16, 32, 64"});
  require_status(check_dtype({0, 12, 1}, 0), absl::StatusCode::kInvalidArgument,
                 {"12 bits", "8, 16, 32, 64"});
  require_status(check_dtype({4, 32, 1}, 0), absl::StatusCode::kInvalidArgument, {"bfloat", "16"});
  require_status(check_dtype({5, 32, 1}, 0), absl::StatusCode::kInvalidArgument,
                 {"complex", "64, 128"});
  require_status(check_dtype({6, 1, 1}, 0), absl::StatusCode::kInvalidArgument, {"bool", "8"});
  require_status(check_dtype({12, 16, 1}, 0), absl::StatusCode::kInvalidArgument,
                 {"float8_e5m2", "8"});
  require_status(check_dtype({15, 8, 1}, 0), absl::StatusCode::kInvalidArgument,
                 {"float6_e2m3fn", "6"});
  require_status(check_dtype({17, 8, 1}, 0), absl::StatusCode::kInvalidArgument,
                 {"float4_e2m1fn", "4"});
  require_status(check_dtype({2, 0, 1}, 0), absl::StatusCode::kInvalidArgument, {"0 bits"});
}

TEST_CASE("unknown type codes are refused", "[transfer][dtype]") {
  require_status(check_dtype({18, 8, 1}, 0), absl::StatusCode::kInvalidArgument,
                 {"dtype code 18", "not a DLPack type code", "0-17"});
  require_status(check_dtype({255, 8, 1}, 0), absl::StatusCode::kInvalidArgument,
                 {"dtype code 255"});
  CHECK(dtype{18, 8, 1}.name() == "dtype(code=18, bits=8, lanes=1)");
}

TEST_CASE("a dtype of 0 lanes is malformed, not unsupported", "[transfer][dtype]") {
  require_status(check_dtype({2, 32, 0}, 0), absl::StatusCode::kInvalidArgument,
                 {"0 lanes", "at least one lane", "lanes=1"});
}

TEST_CASE("unsupported but legal dtypes are unimplemented with a way out", "[transfer][dtype]") {
  require_status(check_dtype({3, 64, 1}, 0), absl::StatusCode::kUnimplemented,
                 {"opaque_handle", "export plain data"});
  require_status(check_dtype({2, 32, 4}, 0), absl::StatusCode::kUnimplemented,
                 {"float32x4", "4 lanes", "trailing dimension of 4"});
  require_status(check_dtype(dtypes::float4_e2m1fn, flag_subbyte_padded),
                 absl::StatusCode::kUnimplemented, {"IS_SUBBYTE_TYPE_PADDED", "packed"});
  // The padded flag means nothing for byte-sized types.
  CHECK(check_dtype(dtypes::float32, flag_subbyte_padded).ok());
}

TEST_CASE("dtypes convert to and from DLDataType", "[transfer][dtype]") {
  const DLDataType dl = dtypes::bfloat16.to_dl();
  CHECK(dl.code == 4);
  CHECK(dl.bits == 16);
  CHECK(dl.lanes == 1);
  CHECK(dtype::from_dl(dl) == dtypes::bfloat16);
  CHECK(dtypes::complex128.padded_size() == 16);
  CHECK(dtypes::float4_e2m1fn.is_sub_byte());
  CHECK_FALSE(dtypes::int8.is_sub_byte());
}

}  // namespace dlasync
