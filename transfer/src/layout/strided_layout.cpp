#include "transfer/src/layout/strided_layout.hpp"

#include <algorithm>
#include <limits>
#include <utility>

namespace dlasync::detail {

void row_major_strides(std::span<const std::int64_t> shape, std::span<std::int64_t> strides) {
  std::int64_t stride = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    if (__builtin_mul_overflow(stride, std::max<std::int64_t>(shape[i], 1), &stride)) {
      stride = std::numeric_limits<std::int64_t>::max();
    }
  }
}

std::optional<element_reach> reach_of(std::span<const std::int64_t> shape,
                                      std::span<const std::int64_t> strides) {
  element_reach r;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    std::int64_t reach = 0;
    std::int64_t& end = strides[i] < 0 ? r.low : r.high;
    if (__builtin_mul_overflow(shape[i] - 1, strides[i], &reach) ||
        __builtin_add_overflow(end, reach, &end)) {
      return std::nullopt;
    }
  }
  return r;
}

strided_layout simplify(const strided_layout& layout) {
  strided_layout out;
  out.element_size = layout.element_size;
  if (std::find(layout.shape.begin(), layout.shape.end(), 0) != layout.shape.end()) {
    out.shape.push_back(0);
    out.strides.push_back(1);
    return out;
  }
  for (std::size_t i = 0; i < layout.shape.size(); ++i) {
    push_simplified(out, layout.shape[i], layout.strides[i]);
  }
  end_simplified(out);
  return out;
}

void push_simplified(strided_layout& out, std::int64_t extent, std::int64_t stride) {
  if (extent == 1) return;
  std::int64_t across = 0;
  if (!out.shape.empty() && !__builtin_mul_overflow(stride, extent, &across) &&
      out.strides.back() == across) {
    out.shape.back() *= extent;  // bounded by the element count
    out.strides.back() = stride;
  } else {
    out.shape.push_back(extent);
    out.strides.push_back(stride);
  }
}

void end_simplified(strided_layout& out) {
  if (out.shape.empty()) {  // a single element
    out.shape.push_back(1);
    out.strides.push_back(1);
  }
}

bool is_simplified(const strided_layout& layout) {
  const std::size_t n = layout.shape.size();
  if (n == 0 || layout.strides.size() != n) return false;
  if (n == 1 && (layout.shape[0] == 0 || layout.shape[0] == 1)) return layout.strides[0] == 1;
  for (std::size_t i = 0; i < n; ++i) {
    if (layout.shape[i] <= 1) return false;
    std::int64_t across = 0;
    if (i + 1 < n && !__builtin_mul_overflow(layout.strides[i + 1], layout.shape[i + 1], &across) &&
        layout.strides[i] == across) {
      return false;
    }
  }
  return true;
}

run_shape innermost_run(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides,
                        std::uint64_t element_bytes) {
  run_shape r{0, element_bytes};
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) {
      ++r.inner_dims;
      continue;
    }
    if (strides[i] != expected) break;
    expected *= shape[i];
    r.bytes *= static_cast<std::uint64_t>(shape[i]);
    ++r.inner_dims;
  }
  return r;
}

bool fills_span(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides) {
  absl::InlinedVector<std::pair<std::uint64_t, std::int64_t>, 8> dims;  // |stride|, extent
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (strides[i] == 0) return false;
    const std::int64_t s = strides[i];
    dims.emplace_back(s < 0 ? 0 - static_cast<std::uint64_t>(s) : static_cast<std::uint64_t>(s),
                      shape[i]);
  }
  std::sort(dims.begin(), dims.end());
  std::uint64_t expected = 1;
  for (const auto& [stride, extent] : dims) {
    if (stride != expected) return false;
    expected *= static_cast<std::uint64_t>(extent);  // bounded by validation
  }
  return true;
}

byte_extent byte_extent_of(const strided_layout& layout) {
  for (const std::int64_t e : layout.shape) {
    if (e == 0) return {};
  }
  // Validation checked a non-empty tensor's span for overflow.
  const std::optional<element_reach> r = reach_of(layout.shape, layout.strides);
  const auto element = static_cast<std::int64_t>(layout.element_size);
  if (!r) return {0, std::numeric_limits<std::uint64_t>::max()};
  return {r->low * element, static_cast<std::uint64_t>((r->high - r->low) * element + element)};
}

std::uint64_t compact_bytes(const strided_layout& layout) {
  std::uint64_t bytes = layout.element_size;
  for (const std::int64_t e : layout.shape) bytes *= static_cast<std::uint64_t>(e);
  return bytes;
}

}  // namespace dlasync::detail
