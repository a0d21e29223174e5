#include "transfer/src/kernels/strided_copy.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "transfer/src/kernels/copy_kernels.hpp"

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace dlasync {
namespace {

using copy_kernels::copy_element;
using copy_kernels::line_bytes;
using copy_kernels::tile;

// Runs copy this many bytes a unit, gathers this many.
constexpr std::int64_t run_unit_bytes = std::int64_t{256} << 10;
constexpr std::int64_t gather_unit_bytes = std::int64_t{64} << 10;
// 2 KiB: half a page of a source row per visit. Measured against 512 B
// (docs/performance.md): 0.63 of memcpy against 0.40 for a 64 MiB
// transpose, the same at 1 MiB.
constexpr std::int64_t tile_run_bytes = 2048;
// From 32 MiB on, a whole page (4 KiB) of each source row per visit. Past
// the last-level cache the source side limits a tile: the same strided read
// pattern alone, side 16384, reads 12 GB/s in 2 KiB visits and 15 GB/s in
// 4 KiB ones (the hardware prefetchers stop at page ends, so each half-page
// visit starts a stream over). Paired against memcpy: 2-D 64 MiB 0.63 ->
// 0.69, 256 MiB 0.59 -> 0.65, 1 GiB 0.51 -> 0.58; 3-D 32 MiB 0.65 -> 0.73,
// 512 MiB 0.58 -> 0.62. At 16 MiB and below (in cache) the same, and 2 KiB
// keeps twice the units there for splitting a copy among threads. 8 KiB
// visits were slower (0.67 -> 0.55 at 1 GiB: twice the destination rows, and
// so pages, per unit).
constexpr std::int64_t tile_page_run_bytes = 4096;
constexpr std::uint64_t tile_page_run_min_bytes = std::uint64_t{32} << 20;
// The AVX-512 tiles' visits from there on (see the constructor).
constexpr std::int64_t tile_far_wide_run_bytes = 1024;
// Tiles write whole destination lines with streaming stores from this many
// bytes on: past the caches they save the read of each destination line
// before it is written (0.78 of memcpy against 0.35 at 16 MiB). So do runs
// of 256 bytes or more that read a small source many times (broadcast: 15.5
// GB/s against 8.6 at 16 MiB).
constexpr std::uint64_t stream_min_bytes = std::uint64_t{2} << 20;
// Copies of up to this many bytes count as in the core's caches: runs are
// copied inline in registers (copy_kernels::copy_runs says why), and the
// AVX-512 tiles do not prefetch.
constexpr std::uint64_t in_cache_max_bytes = std::uint64_t{4} << 20;
// A source of up to this many bytes, read again and again (a broadcast),
// stays in a core's own cache.
constexpr std::uint64_t small_source_max_bytes = std::uint64_t{256} << 10;

}  // namespace

void strided_copy::allow_avx2(bool allowed) noexcept {
  copy_kernels::allow_avx2(allowed);
}

void strided_copy::allow_avx512(bool allowed) noexcept {
  copy_kernels::allow_avx512(allowed);
}

void strided_copy::allow_streaming(bool everywhere) noexcept {
  copy_kernels::allow_streaming(everywhere);
}

strided_copy::strided_copy(const strided_layout& layout, std::uint64_t max_unit_bytes)
    : element_size_(layout.element_size) {
  const std::int64_t es = static_cast<std::int64_t>(element_size_);
  bytes_ = detail::compact_bytes(layout);
  if (bytes_ == 0) return;  // kernel none, no units

  // A plan's layout is simplified already.
  strided_layout simplified;
  const bool simple = detail::is_simplified(layout);
  if (!simple) simplified = detail::simplify(layout);
  const strided_layout& use = simple ? layout : simplified;
  shape_ = use.shape;
  for (const std::int64_t stride : use.strides) src_stride_.push_back(stride * es);
  ndim_ = static_cast<int>(shape_.size());
  dst_stride_.resize(shape_.size());
  std::int64_t d = es;
  for (int i = ndim_ - 1; i >= 0; --i) {
    dst_stride_[i] = d;
    d *= shape_[i];
  }

  const int last = ndim_ - 1;
  if (src_stride_[last] == es) {
    kernel_ = kernel::runs;
  } else {
    // Tiles have kernels for the element sizes of real dtypes.
    const bool sized = es == 1 || es == 2 || es == 4 || es == 8 || es == 16;
    for (int i = last - 1; i >= 0 && sized; --i) {
      if (src_stride_[i] == es && shape_[i] >= 8 && shape_[last] >= 8) {
        tile_dim_ = i;
        break;
      }
    }
    kernel_ = tile_dim_ >= 0 ? kernel::tile : kernel::gather;
  }

  if (kernel_ == kernel::tile) {
    // Each unit reads tile_run_bytes (a page past the caches) from every
    // source row it visits, so a visit to a far-away row (often another
    // page) brings several lines.
    split_dim_ = tile_dim_;
    // The AVX-512 tiles never visit whole pages, and prefetch past the
    // caches instead: page visits measured slower with them on a Zen 5 core
    // (side 8192: 0.35 of memcpy against 0.59 with prefetches, standalone),
    // and prefetches in the caches cost (side 512: 0.43 -> 0.33) where past
    // them they paid (side 2048: 0.37 -> 0.42). From 32 MiB they visit a
    // quarter page, not half: fewer destination rows per unit, whose lines
    // share cache sets at power-of-two strides (side 16384: 0.32 -> 0.43 of
    // memcpy, 8192: 0.50 -> 0.53, standalone).
    const bool wide_tiles = element_size_ == 4 && copy_kernels::avx512_tiles();
    const bool far = bytes_ >= tile_page_run_min_bytes;
    prefetch_ = bytes_ > in_cache_max_bytes && wide_tiles;
    std::int64_t run = tile_run_bytes;
    if (far) run = wide_tiles ? tile_far_wide_run_bytes : tile_page_run_bytes;
    block_ = std::max<std::int64_t>(tile, run / es);
  } else {
    split_dim_ = last;
    std::int64_t unit = kernel_ == kernel::runs ? run_unit_bytes : gather_unit_bytes;
    if (max_unit_bytes != 0) unit = std::min(unit, static_cast<std::int64_t>(max_unit_bytes));
    block_ = std::max<std::int64_t>(1, unit / es);
  }
  block_ = std::min(block_, shape_[split_dim_]);
  blocks_ = (shape_[split_dim_] + block_ - 1) / block_;
  outer_count_ = 1;
  for (int i = 0; i < split_dim_; ++i) {
    outer_dims_.push_back(i);
    outer_count_ *= shape_[i];
  }
  if (kernel_ == kernel::runs) {
    // Runs stream only when they read far less than they write (broadcast:
    // the source stays in cache, and writes are the whole cost). Where the
    // source streams from memory too, streaming stores measured slower
    // (docs/performance.md).
    // Read only where it decides something: a small copy stays in the
    // caches whatever its source's span.
    const bool far = bytes_ >= stream_min_bytes || bytes_ > in_cache_max_bytes;
    const std::uint64_t span = far ? detail::byte_extent_of(use).length : bytes_;
    // Each source byte read 4 times or more, on average.
    const bool reread_source = span * 4 <= bytes_;
    stream_ = copy_kernels::streaming_stores() && bytes_ >= stream_min_bytes &&
              shape_[last] * es >= 256 && reread_source;
    // Inline register copies where the copy stays in the caches, and where
    // a source that stays in the core's cache is read many times (a
    // broadcast that does not stream): there the stores are the whole cost,
    // and the inline loop's beat a memcpy call per run past the caches too
    // (Zen 5, 1 KiB source, kernel against memcpy: 16 MiB 1.17-1.30 ->
    // 2.14-2.51, 256 MiB 1.14-1.16 -> 1.75-1.80; with streaming stores
    // instead, 1.29-1.55 and 1.16-1.19).
    runs_inline_ =
        bytes_ <= in_cache_max_bytes || (reread_source && span <= small_source_max_bytes);
  }
  if (kernel_ == kernel::tile) {
    stream_ = copy_kernels::streaming_stores() && bytes_ >= stream_min_bytes;
    std::int64_t row_bytes = shape_[last] * es;
    for (int i = split_dim_ + 1; i < last; ++i) {
      middle_dims_.push_back(i);
      row_bytes *= shape_[i];
    }
    if (max_unit_bytes != 0) {
      const auto rows = static_cast<std::int64_t>(max_unit_bytes) / row_bytes;
      block_ = std::max<std::int64_t>(1, std::min(block_, rows));
      blocks_ = (shape_[split_dim_] + block_ - 1) / block_;
    }
  }
}

std::uint64_t strided_copy::dst_offset(std::int64_t unit) const noexcept {
  if (blocks_ == 0) return 0;
  const std::int64_t row = dst_stride_[split_dim_];
  const std::int64_t outer = unit / blocks_;
  const std::int64_t first = std::min((unit % blocks_) * block_, shape_[split_dim_]);
  return static_cast<std::uint64_t>(outer * shape_[split_dim_] * row + first * row);
}

std::uint64_t strided_copy::unit_bytes() const noexcept {
  if (units() == 0) return 0;
  return bytes_ / static_cast<std::uint64_t>(units());
}

void strided_copy::run(const void* src, void* dst, std::int64_t begin, std::int64_t end,
                       std::uint64_t dst_origin) const {
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  const auto origin = static_cast<std::int64_t>(dst_origin);
  switch (element_size_) {
    case 1: return run_sized<1>(s, d, begin, end, origin);
    case 2: return run_sized<2>(s, d, begin, end, origin);
    case 4: return run_sized<4>(s, d, begin, end, origin);
    case 8: return run_sized<8>(s, d, begin, end, origin);
    case 16: return run_sized<16>(s, d, begin, end, origin);
    default: return run_sized<0>(s, d, begin, end, origin);
  }
}

template <std::size_t N>
void strided_copy::run_sized(const char* src, char* dst, std::int64_t begin, std::int64_t end,
                             std::int64_t dst_origin) const {
  if (begin >= end || kernel_ == kernel::none) return;
  const std::size_t es = N != 0 ? N : element_size_;
  auto copy_one = [es](char* to, const char* from) {
    if constexpr (N != 0) {
      copy_element<N>(to, from);
      (void)es;
    } else {
      std::memcpy(to, from, es);
    }
  };

  // Position the outer odometer at unit `begin`.
  const int outer = static_cast<int>(outer_dims_.size());
  std::int64_t index[max_ndim] = {};
  std::int64_t flat = begin / blocks_;
  std::int64_t block = begin % blocks_;
  std::int64_t src_off = 0;
  std::int64_t dst_off = -dst_origin;
  for (int j = outer - 1; j >= 0; --j) {
    const int dim = outer_dims_[j];
    index[j] = flat % shape_[dim];
    flat /= shape_[dim];
    src_off += index[j] * src_stride_[dim];
    dst_off += index[j] * dst_stride_[dim];
  }

  // Moves the outer odometer `count` on in its innermost dimension (at most
  // to that dimension's end), carrying into the dimensions outside it.
  auto step_outer = [&](std::int64_t count) {
    for (int j = outer - 1; j >= 0; --j) {
      const int dim = outer_dims_[j];
      src_off += count * src_stride_[dim];
      dst_off += count * dst_stride_[dim];
      index[j] += count;
      if (index[j] < shape_[dim]) break;
      src_off -= index[j] * src_stride_[dim];
      dst_off -= index[j] * dst_stride_[dim];
      index[j] = 0;
      count = 1;
    }
  };

  const int last = ndim_ - 1;
  const std::int64_t extent = shape_[split_dim_];
  if (kernel_ == kernel::runs && blocks_ == 1 && !stream_) {
    // Whole runs, a unit each: the runs along the innermost outer dimension
    // go in one call (copy_runs), the odometer then steps past them.
    const auto n = static_cast<std::size_t>(extent) * es;
    for (std::int64_t u = begin; u < end;) {
      std::int64_t count = 1;
      std::int64_t step = 0;
      if (outer > 0) {
        const int dim = outer_dims_[outer - 1];
        count = std::min(end - u, shape_[dim] - index[outer - 1]);
        step = src_stride_[dim];
      }
      copy_kernels::copy_runs(dst + dst_off, src + src_off, n, count, step, runs_inline_);
      u += count;
      step_outer(count);
    }
    return;
  }
  for (std::int64_t u = begin; u < end; ++u) {
    const std::int64_t lo = block * block_;
    const std::int64_t hi = std::min(lo + block_, extent);
    const char* s = src + src_off;
    char* d = dst + dst_off;
    if (kernel_ == kernel::runs) {
      char* to = d + lo * static_cast<std::int64_t>(es);
      const char* from = s + lo * static_cast<std::int64_t>(es);
      const auto n = static_cast<std::size_t>(hi - lo) * es;
      if (stream_) {
        copy_kernels::stream_run(to, from, n);
      } else {
        std::memcpy(to, from, n);
      }
    } else if (kernel_ == kernel::gather) {
      const std::int64_t ss = src_stride_[last];
      for (std::int64_t i = lo; i < hi; ++i) {
        copy_one(d + i * static_cast<std::int64_t>(es), s + i * ss);
      }
    } else if constexpr (N != 0) {
      // Rows [r0, r1): one (tile, last) plane for each index of the middle
      // dimensions.
      auto rows = [&](std::int64_t r0, std::int64_t r1) {
        const int middle = static_cast<int>(middle_dims_.size());
        std::int64_t mid[max_ndim] = {};
        std::int64_t mid_src = 0;
        std::int64_t mid_dst = 0;
        while (true) {
          copy_kernels::transpose_rows<N>(s + mid_src, src_stride_[last], d + mid_dst,
                                          dst_stride_[tile_dim_], r0, r1, shape_[last],
                                          {stream_, prefetch_});
          int j = middle - 1;
          for (; j >= 0; --j) {
            const int dim = middle_dims_[j];
            mid_src += src_stride_[dim];
            mid_dst += dst_stride_[dim];
            if (++mid[j] < shape_[dim]) break;
            mid_src -= mid[j] * src_stride_[dim];
            mid_dst -= mid[j] * dst_stride_[dim];
            mid[j] = 0;
          }
          if (j < 0) break;
        }
      };
      // Units of a page of each source row, several of them in this range:
      // walked together, in pieces of block_ rows that start where the
      // source's pages do (the first source row's; every row's where the
      // row stride is a multiple of a page), so that no visit splits a page
      // between two visits far apart. A source a line past a page start (as
      // large aligned allocations are): 2-D 256 MiB 0.66 -> 0.70 of memcpy,
      // 1 GiB 0.58 -> 0.62; 3-D 512 MiB 0.62 -> 0.65. A range of one unit
      // (the workers' cancellable steps) is walked as it is.
      const std::int64_t take = std::min(end - u, blocks_ - block);
      const auto at = reinterpret_cast<std::uintptr_t>(s + lo * static_cast<std::int64_t>(N));
      if (take > 1 && block_ * static_cast<std::int64_t>(N) == tile_page_run_bytes &&
          at % line_bytes == 0) {
        const std::int64_t all_hi = std::min((block + take) * block_, extent);
        const auto to_page = static_cast<std::int64_t>(
            (tile_page_run_bytes - at % tile_page_run_bytes) % tile_page_run_bytes / N);
        std::int64_t r = lo;
        if (to_page > 0) {
          rows(r, r + to_page);
          r += to_page;
        }
        for (; r < all_hi; r += block_) rows(r, std::min(r + block_, all_hi));
        u += take - 1;
        block += take - 1;
      } else {
        rows(lo, hi);
      }
    }
    if (++block == blocks_) {
      block = 0;
      step_outer(1);
    }
  }
#if defined(__SSE2__)
  // Streaming stores are weakly ordered: they are made visible before the
  // copy reports its end.
  if (stream_) _mm_sfence();
#endif
}

}  // namespace dlasync
