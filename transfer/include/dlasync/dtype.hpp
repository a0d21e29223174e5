// dlasync/dtype.hpp
//
// `dlasync::dtype` is DLPack's `DLDataType` as a value with names: all type
// codes of DLPack 1.3 (integers, floats, bfloat16, complex, bool, the float8,
// float6 and float4 families) and the bit widths each allows.
//
// Example:
//
//   dlasync::dtype t = dlasync::dtypes::bfloat16;
//   t.name();               // "bfloat16"
//   dlasync::check_dtype(t, 0).ok();  // true
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "dlasync/dlpack.hpp"

namespace dlasync {

// DLPack's type codes (`DLDataTypeCode`, including the ones newer than 0.6).
enum class dtype_code : std::uint8_t {
  int_ = 0,
  uint = 1,
  float_ = 2,
  opaque_handle = 3,
  bfloat = 4,
  complex = 5,
  bool_ = 6,
  float8_e3m4 = 7,
  float8_e4m3 = 8,
  float8_e4m3b11fnuz = 9,
  float8_e4m3fn = 10,
  float8_e4m3fnuz = 11,
  float8_e5m2 = 12,
  float8_e5m2fnuz = 13,
  float8_e8m0fnu = 14,
  float6_e2m3fn = 15,
  float6_e3m2fn = 16,
  float4_e2m1fn = 17,
};

struct dtype {
  std::uint8_t code = 0;
  std::uint8_t bits = 0;
  std::uint16_t lanes = 1;

  friend bool operator==(const dtype&, const dtype&) = default;

  static constexpr dtype from_dl(DLDataType t) noexcept { return {t.code, t.bits, t.lanes}; }
  constexpr DLDataType to_dl() const noexcept { return DLDataType{code, bits, lanes}; }

  // Fewer than 8 bits an element: packed several to a byte unless the
  // producer set IS_SUBBYTE_TYPE_PADDED.
  constexpr bool is_sub_byte() const noexcept { return bits < 8; }

  // Bytes an element takes when it is not packed: ceil(bits * lanes / 8).
  constexpr std::uint32_t padded_size() const noexcept {
    return (static_cast<std::uint32_t>(bits) * lanes + 7) / 8;
  }

  // "float32", "bool", "float8_e4m3fn"; types outside DLPack's list as
  // "dtype(code=42, bits=7, lanes=1)". Lanes other than 1 add "x4".
  std::string name() const;
};

std::ostream& operator<<(std::ostream& os, const dtype& t);

namespace dtypes {
inline constexpr dtype int8{0, 8, 1};
inline constexpr dtype int16{0, 16, 1};
inline constexpr dtype int32{0, 32, 1};
inline constexpr dtype int64{0, 64, 1};
inline constexpr dtype uint8{1, 8, 1};
inline constexpr dtype uint16{1, 16, 1};
inline constexpr dtype uint32{1, 32, 1};
inline constexpr dtype uint64{1, 64, 1};
inline constexpr dtype float16{2, 16, 1};
inline constexpr dtype float32{2, 32, 1};
inline constexpr dtype float64{2, 64, 1};
inline constexpr dtype bfloat16{4, 16, 1};
inline constexpr dtype complex64{5, 64, 1};
inline constexpr dtype complex128{5, 128, 1};
inline constexpr dtype bool8{6, 8, 1};
inline constexpr dtype float8_e4m3fn{10, 8, 1};
inline constexpr dtype float8_e5m2{12, 8, 1};
inline constexpr dtype float6_e2m3fn{15, 6, 1};
inline constexpr dtype float4_e2m1fn{17, 4, 1};
}  // namespace dtypes

// OK when dlasync can import elements of type `t` given the tensor's
// versioned `flags`:
//   InvalidArgument  unknown code, or bits not valid for the code;
//   Unimplemented    lanes != 1, opaque handles, padded sub-byte elements.
absl::Status check_dtype(dtype t, std::uint64_t flags);

}  // namespace dlasync
