// Test support: the tensor layouts and dtypes every import path is tried
// with, and an element-by-element comparison against the source.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dlasync/dtype.hpp"
#include "dlasync/tensor.hpp"
#include "support/test_tensors.hpp"

namespace dlasync::testing {

// Every dtype dlasync imports: each code with each valid width.
inline std::vector<dtype> supported_dtypes() {
  return {dtypes::int8,        dtypes::int16,        dtypes::int32,         dtypes::int64,
          dtypes::uint8,       dtypes::uint16,       dtypes::uint32,        dtypes::uint64,
          dtypes::float16,     dtypes::float32,      dtypes::float64,       dtypes::bfloat16,
          dtypes::complex64,   dtypes::complex128,   dtypes::bool8,         dtype{7, 8, 1},
          dtype{8, 8, 1},      dtype{9, 8, 1},       dtypes::float8_e4m3fn, dtype{11, 8, 1},
          dtypes::float8_e5m2, dtype{13, 8, 1},      dtype{14, 8, 1},       dtypes::float6_e2m3fn,
          dtype{16, 6, 1},     dtypes::float4_e2m1fn};
}

// A view of a source buffer: shape, strides (empty: NULL) and the offset of
// the first element, in elements.
struct layout_case {
  std::string name;
  std::vector<std::int64_t> shape;
  std::optional<std::vector<std::int64_t>> strides;
  std::int64_t offset = 0;
  bool sub_byte_ok = false;  // compact layouts work for packed sub-byte types too
};

// Views into a buffer of at least 64 elements.
inline std::vector<layout_case> layout_cases() {
  return {
      {"compact 3x4x5", {3, 4, 5}, std::nullopt, 0, true},
      {"compact with explicit strides", {3, 4}, std::vector<std::int64_t>{4, 1}, 0, true},
      {"transposed 5x4", {5, 4}, std::vector<std::int64_t>{1, 5}, 0, false},
      {"permuted 4x5x3", {4, 5, 3}, std::vector<std::int64_t>{5, 1, 20}, 0, false},
      {"sliced rows with byte offset", {2, 3}, std::vector<std::int64_t>{5, 1}, 6, false},
      {"every other column", {3, 4}, std::vector<std::int64_t>{8, 2}, 1, false},
      {"broadcast rows", {4, 5}, std::vector<std::int64_t>{0, 1}, 0, false},
      {"reversed rows", {4, 5}, std::vector<std::int64_t>{-5, 1}, 15, false},
      {"reversed vector", {9}, std::vector<std::int64_t>{-1}, 8, false},
      {"size 0", {0, 3}, std::nullopt, 0, true},
      {"0-d", {}, std::nullopt, 3, false},
  };
}

// Fills `bytes` with a pattern that differs at every byte.
inline void fill_pattern(std::vector<std::uint8_t>& bytes) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<std::uint8_t>(i * 131 + 17);
  }
}

// A pattern-filled buffer and a tensor of `type` laid out over it as `c`
// says. `first()` is where the layout's first element is.
struct layout_source {
  std::vector<std::uint8_t> bytes;
  tensor_spec spec;
  layout_source(dtype type, const layout_case& c) : bytes(128 * type.padded_size()) {
    fill_pattern(bytes);
    spec.type = type;
    spec.shape = c.shape;
    spec.strides = c.strides;
    spec.data = bytes.data();
    spec.byte_offset =
        static_cast<std::uint64_t>(c.offset) * (type.is_sub_byte() ? 1 : type.padded_size());
  }
  const std::uint8_t* first() const { return bytes.data() + spec.byte_offset; }
};

// True when `t` holds, element by element, what the layout reads from
// `source` (the first element at `first`).
inline bool same_elements(const tensor& t, const void* first, const layout_case& c, dtype type) {
  if (type.is_sub_byte()) {
    return t.byte_size() == 0 || std::memcmp(t.data(), first, t.byte_size()) == 0;
  }
  const std::size_t es = type.bits / 8u;
  const std::size_t n = c.shape.size();
  std::vector<std::int64_t> src_strides(n);
  std::int64_t s = 1;
  for (std::size_t i = n; i-- > 0;) {
    src_strides[i] = c.strides ? (*c.strides)[i] : s;
    s *= c.shape[i];
  }
  std::int64_t count = 1;
  for (std::int64_t e : c.shape) count *= e;
  std::vector<std::int64_t> index(n, 0);
  for (std::int64_t k = 0; k < count; ++k) {
    std::int64_t so = 0;
    std::int64_t to = 0;
    for (std::size_t d = 0; d < n; ++d) {
      so += index[d] * src_strides[d];
      to += index[d] * t.strides()[d];
    }
    const auto* want = static_cast<const char*>(first) + so * static_cast<std::int64_t>(es);
    const auto* got = static_cast<const char*>(t.data()) + to * static_cast<std::int64_t>(es);
    if (std::memcmp(want, got, es) != 0) return false;
    for (std::size_t d = n; d-- > 0;) {
      if (++index[d] < c.shape[d]) break;
      index[d] = 0;
    }
  }
  return true;
}

}  // namespace dlasync::testing
