// The layout floor (internal): one home for the arithmetic of a strided
// layout, below everything else in transfer. Validation, the transfer plan,
// the copy kernels, the gather and the remote pieces all ask it; none of
// them walks shapes and strides on its own.
//
//   row_major_strides   the strides of a compact row-major tensor
//   reach_of            the elements the strides reach, below and above the
//                       first one (overflow-checked)
//   simplify            extents of 1 dropped, dimensions that are contiguous
//                       with each other merged
//   innermost_run       the contiguous run of a row-major walk
//   fills_span          whether the elements fill their span exactly once
//   byte_extent_of      the bytes a layout reads around its first element
//
// Shapes and strides are in elements; the functions take spans, so that a
// DLTensor's arrays, a layout's vectors and a descriptor's alike can be
// asked without copying. Nothing here reads tensor data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "absl/container/inlined_vector.h"

namespace dlasync {

// How a copy reads its source: element size, extents and strides (in
// elements). The transfer plan builds it once from the DLPack tensor
// (transfer/src/plan/transfer_plan.hpp).
struct strided_layout {
  std::size_t element_size = 1;                  // bytes
  absl::InlinedVector<std::int64_t, 8> shape;    // extents
  absl::InlinedVector<std::int64_t, 8> strides;  // in elements, may be 0 or negative
};

}  // namespace dlasync

namespace dlasync::detail {

// Writes the row-major strides (in elements) of `shape` into `strides`, of
// the same length. Validation bounds their product for tensors with
// elements; a size-0 tensor may have huge other extents and addresses
// nothing, so its strides saturate at INT64_MAX instead of overflowing.
void row_major_strides(std::span<const std::int64_t> shape, std::span<std::int64_t> strides);

// The elements a layout reaches relative to its first element: from `low`
// (<= 0) to `high` (>= 0), inclusive. Extents of 1 reach nothing whatever
// their stride.
struct element_reach {
  std::int64_t low = 0;
  std::int64_t high = 0;
};

// nullopt when a reach overflows 64 bits. Requires extents >= 1 (an empty
// tensor reaches nothing, and callers say so before asking).
std::optional<element_reach> reach_of(std::span<const std::int64_t> shape,
                                      std::span<const std::int64_t> strides);

// The layout with extents of 1 dropped and each dimension merged into the
// next inner one where the source is contiguous across them (the outer
// stride is the inner one times its extent). A single element is {1}/{1};
// an empty tensor (an extent of 0) is {0}/{1}. Merging keeps the walk's
// row-major order, so a compact destination is the same either way.
strided_layout simplify(const strided_layout& layout);

// simplify's steps, for a caller that walks dimensions of its own (the
// transfer plan, over a DLTensor): push each dimension of a non-empty
// tensor, outermost first, onto `out` (empty, with its element size), then
// end it.
void push_simplified(strided_layout& out, std::int64_t extent, std::int64_t stride);
void end_simplified(strided_layout& out);

// Whether simplify would return `layout` as it is (a plan's layout is), so
// that a kernel given one need not simplify again.
bool is_simplified(const strided_layout& layout);

// The innermost contiguous run of a row-major walk over `shape` with
// `strides` (elements of `element_bytes` bytes): how many dimensions it
// covers, from the last (extents of 1 included), and its length in bytes.
struct run_shape {
  std::size_t inner_dims = 0;
  std::uint64_t bytes = 0;
};
run_shape innermost_run(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides,
                        std::uint64_t element_bytes);

// Whether the elements fill their span exactly once: the extents above 1,
// taken by the size of their strides, step as a compact layout does (each
// stride the product of the smaller ones' extents), in any order and
// direction. Requires a non-empty tensor whose span validation bounded.
bool fills_span(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides);

// The bytes a non-empty layout reads, relative to its first element:
// [offset, offset + length). An empty one reads nothing ({0, 0}).
struct byte_extent {
  std::int64_t offset = 0;
  std::uint64_t length = 0;
};
byte_extent byte_extent_of(const strided_layout& layout);

// The bytes of the layout's elements stored compactly.
std::uint64_t compact_bytes(const strided_layout& layout);

}  // namespace dlasync::detail
