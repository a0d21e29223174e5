// `dlasync::strided_copy` (internal) gathers a strided host tensor into compact
// row-major order. It is prepared once from the layout, then run over ranges
// of "units" that may execute concurrently on several threads, so one large
// copy can be split across a worker pool.
//
// Example:
//
//   dlasync::strided_layout layout{4, {1024, 1024}, {1, 1024}};  // a transpose
//   dlasync::strided_copy copy(layout);
//   copy.run(src, dst, 0, copy.units());  // or split [0, units()) among threads
//
// The layout is simplified first (the layout floor's simplify: extents of 1
// dropped, dimensions that are contiguous with each other merged). Then one of three kernels
// does the work:
//   runs    the innermost source stride is 1: memcpy of contiguous runs;
//   tile    another dimension has source stride 1: cache-blocked tiles, so
//           that reads and writes both stay in cache (transposes);
//   gather  otherwise (broadcast, reversed or sparse strides): element loops.
// Zero and negative strides are supported. Sub-byte data must be described as
// bytes (element size 1, compact).
//
// Thread safety: a prepared copy is immutable; concurrent `run` calls over
// disjoint unit ranges are safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "dlasync/limits.hpp"
#include "transfer/src/layout/strided_layout.hpp"

namespace dlasync {

class strided_copy {
 public:
  enum class kernel : std::uint8_t { none, runs, tile, gather };

  // `layout` must describe a valid tensor (validation does that): extents
  // >= 0, shape and strides of the same length.
  // `max_unit_bytes`, when not 0, caps what one unit writes where the
  // kernel allows (tiles shrink to single rows of the tile dimension).
  explicit strided_copy(const strided_layout& layout, std::uint64_t max_unit_bytes = 0);

  // Bytes written to the destination.
  std::uint64_t bytes() const noexcept { return bytes_; }

  // Independent pieces of work; 0 for an empty tensor.
  std::int64_t units() const noexcept { return outer_count_ * blocks_; }

  // Bytes one unit writes, about.
  std::uint64_t unit_bytes() const noexcept;

  kernel which() const noexcept { return kernel_; }

  // Whether runs and 4-byte tiles may use AVX2, and 4-byte tiles AVX-512,
  // where the CPU has them (the default; copy_kernels.hpp says which CPUs
  // get the AVX-512 tiles); the tests turn them off to check the other
  // kernels too. Copies constructed afterwards follow the setting.
  static void allow_avx2(bool allowed) noexcept;
  static void allow_avx512(bool allowed) noexcept;
  // Whether large copies may write with streaming stores on every CPU (the
  // tests); false (the default) leaves it to the CPU (copy_kernels.hpp).
  static void allow_streaming(bool everywhere) noexcept;

  // Units write contiguous destination ranges in order: unit u writes
  // [dst_offset(u), dst_offset(u + 1)), and dst_offset(units()) == bytes().
  // So a range of units can be gathered into a chunk of its own (staging).
  std::uint64_t dst_offset(std::int64_t unit) const noexcept;

  // Copies units [begin, end). `src` is the first element of the source;
  // `dst` is where destination byte `dst_origin` goes (0: the start of a
  // compact destination of bytes() bytes; dst_offset(begin): a chunk that
  // holds just these units).
  void run(const void* src, void* dst, std::int64_t begin, std::int64_t end,
           std::uint64_t dst_origin = 0) const;

 private:
  template <std::size_t N>
  void run_sized(const char* src, char* dst, std::int64_t begin, std::int64_t end,
                 std::int64_t dst_origin) const;

  kernel kernel_ = kernel::none;
  std::size_t element_size_ = 1;
  std::uint64_t bytes_ = 0;
  int ndim_ = 0;  // after simplification
  absl::InlinedVector<std::int64_t, 8> shape_;
  absl::InlinedVector<std::int64_t, 8> src_stride_;  // bytes
  absl::InlinedVector<std::int64_t, 8> dst_stride_;  // bytes
  int split_dim_ = 0;                                // the dimension cut into blocks
  int tile_dim_ = -1;                                // tile: the dimension with source stride 1
  // tile: the dimensions between the tile dimension and the last, iterated
  // inside each unit so that a unit's destination stays contiguous.
  absl::InlinedVector<int, 8> middle_dims_;
  bool stream_ = false;       // write with streaming stores (tiles, broadcast runs)
  bool prefetch_ = false;     // tiles: software prefetches (the AVX-512 tiles past the caches)
  bool runs_inline_ = false;  // runs: inline register copies, not memcpy calls
  std::int64_t block_ = 1;    // elements of split_dim_ per unit
  std::int64_t blocks_ = 0;
  std::int64_t outer_count_ = 0;
  absl::InlinedVector<int, 8> outer_dims_;  // the dimensions before split_dim_
};

}  // namespace dlasync
