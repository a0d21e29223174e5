// The gather kernels' arithmetic, as the GPU runs it (gather_math.hpp is
// compiled into the CUDA kernels as well): word sizes from the actual
// alignment, the index math against a plain reference for every word size,
// up to 64 dimensions, negative and zero strides, a launch geometry that
// covers every word exactly once, and the tiled transpose (its choice, and
// its two phases through the shared tile) on ragged, batched and reversed
// shapes of every word size.
#include "transfer/src/kernels/gather_math.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "catch2/catch.hpp"
#include "transfer/src/kernels/gather.hpp"

namespace dlasync::detail {
namespace {

using copy_kernels::gather_params;

// The compact copy of `layout` read from `src`, element by element in
// row-major order: what the gather must produce.
std::vector<unsigned char> reference(const unsigned char* src, const strided_layout& layout) {
  std::int64_t elements = 1;
  for (std::int64_t e : layout.shape) elements *= e;
  const std::size_t size = layout.element_size;
  std::vector<unsigned char> out(static_cast<std::size_t>(elements) * size);
  for (std::int64_t i = 0; i < elements; ++i) {
    std::int64_t rest = i;
    std::int64_t offset = 0;
    for (std::size_t d = layout.shape.size(); d-- > 0;) {
      offset += (rest % layout.shape[d]) * layout.strides[d];
      rest /= layout.shape[d];
    }
    std::memcpy(out.data() + static_cast<std::size_t>(i) * size,
                src + offset * static_cast<std::int64_t>(size), size);
  }
  return out;
}

// Gathers `layout` with the GPU's grid from a source whose first element
// lies `misalign` bytes past an aligned spot, into a destination at
// `dst_misalign`; checks the bytes against the reference. Returns the
// parameters the gather ran with.
gather_params check_gather(const strided_layout& layout, std::size_t misalign,
                           std::size_t dst_misalign) {
  const auto element = static_cast<std::int64_t>(layout.element_size);
  std::int64_t low = 0;
  std::int64_t high = 0;
  std::int64_t elements = 1;
  for (std::size_t d = 0; d < layout.shape.size(); ++d) {
    elements *= layout.shape[d];
    if (layout.shape[d] == 0) continue;
    const std::int64_t reach = (layout.shape[d] - 1) * layout.strides[d];
    (reach < 0 ? low : high) += reach;
  }
  const auto span = static_cast<std::size_t>((high - low + 1) * element);
  std::vector<unsigned char> storage(span + 64 + 32);
  unsigned char* aligned =
      storage.data() + (32 - reinterpret_cast<std::uintptr_t>(storage.data()) % 32) % 32;
  // Bytes that do not repeat with any short period: an element read from
  // the wrong place shows.
  for (std::size_t i = 0; i < span + 32; ++i) {
    aligned[i] = static_cast<unsigned char>((i * 0x9E3779B97F4A7C15u) >> 56);
  }
  const unsigned char* src = aligned + misalign - low * element;

  std::vector<unsigned char> out_storage(static_cast<std::size_t>(elements * element) + 64);
  unsigned char* dst = out_storage.data() +
                       (32 - reinterpret_cast<std::uintptr_t>(out_storage.data()) % 32) % 32 +
                       dst_misalign;
  std::fill(out_storage.begin(), out_storage.end(), std::uint8_t{0xEE});
  absl::StatusOr<gather_params> p = gather_params_for(dst, src, layout);
  REQUIRE(p.ok());
  CHECK(p->count == elements * p->words_per_element);
  CHECK(p->word_bytes * p->words_per_element == element);
  CHECK(reinterpret_cast<std::uintptr_t>(src) % static_cast<std::uintptr_t>(p->word_bytes) == 0);
  REQUIRE(run_gather_grid(*p, src, dst) == cuda::error::success);
  const std::vector<unsigned char> want = reference(src, layout);
  CHECK(std::equal(want.begin(), want.end(), dst));
  const cuda::memory_range extent = source_extent(src, layout);
  if (elements > 0) {
    CHECK(extent.begin == aligned + misalign);
    CHECK(extent.bytes == span);
  }
  return *p;
}

}  // namespace

TEST_CASE("the gather's word is the largest that the element size and both addresses allow",
          "[copy][gather]") {
  using copy_kernels::gather_word_bytes;
  CHECK(gather_word_bytes(0x1000, 0x2000, 16) == 16);
  CHECK(gather_word_bytes(0x1008, 0x2000, 16) == 8);  // complex128 at 8 mod 16
  CHECK(gather_word_bytes(0x1004, 0x2000, 8) == 4);   // complex64 at 4 mod 8
  CHECK(gather_word_bytes(0x1000, 0x2004, 8) == 4);   // the destination counts too
  CHECK(gather_word_bytes(0x1000, 0x2000, 12) == 4);
  CHECK(gather_word_bytes(0x1000, 0x2000, 32) == 16);
  CHECK(gather_word_bytes(0x1000, 0x2000, 3) == 1);
  CHECK(gather_word_bytes(0x1001, 0x2000, 4) == 1);
  CHECK(gather_word_bytes(0x1002, 0x2000, 2) == 2);
}

TEST_CASE("the gather's index math matches a reference for every word size and stride sign",
          "[copy][gather]") {
  std::mt19937 random(20261204);
  const std::size_t sizes[] = {1, 2, 3, 4, 6, 8, 12, 16, 32};
  int cases = 0;
  for (std::size_t size : sizes) {
    for (int trial = 0; trial < 40; ++trial) {
      strided_layout layout;
      layout.element_size = size;
      const int ndim = std::uniform_int_distribution<int>(1, 5)(random);
      for (int d = 0; d < ndim; ++d) {
        layout.shape.push_back(
            std::uniform_int_distribution<std::int64_t>(trial == 0 ? 0 : 1, 4)(random));
        layout.strides.push_back(std::uniform_int_distribution<std::int64_t>(-6, 6)(random));
      }
      // Misaligned by each power of two below the element's own alignment.
      for (std::size_t misalign :
           {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{4}, std::size_t{8}}) {
        INFO("element " << size << ", ndim " << ndim << ", misaligned by " << misalign);
        check_gather(layout, misalign, trial % 3 == 0 ? 4 : 0);
        ++cases;
      }
    }
  }
  CHECK(cases == 9 * 40 * 5);
}

TEST_CASE("the gather handles 64 dimensions, zero strides and compact bytes", "[copy][gather]") {
  strided_layout wide;
  wide.element_size = 8;
  for (int d = 0; d < max_ndim; ++d) {
    wide.shape.push_back(d % 9 == 0 ? 2 : 1);  // 8 dimensions of 2: 256 elements
    wide.strides.push_back(d % 9 == 0 ? (d % 2 == 0 ? 1 << (d / 9) : -(1 << (d / 9))) : 5);
  }
  check_gather(wide, 0, 0);
  check_gather(wide, 4, 0);
  strided_layout broadcast{16, {3, 5}, {0, 1}};
  check_gather(broadcast, 8, 0);
  // Packed sub-byte data is gathered as compact bytes.
  strided_layout bytes{1, {77}, {1}};
  check_gather(bytes, 3, 1);
  // An empty tensor reaches nothing, whatever its other extents and
  // strides (row-major strides saturate for it): found by the fuzzer.
  strided_layout empty{4, {std::int64_t{1} << 60, 0}, {INT64_MAX, 1}};
  CHECK(source_extent(&wide, empty).bytes == 0);
  strided_layout too_many = wide;
  too_many.shape.push_back(1);
  too_many.strides.push_back(1);
  int dst = 0;
  CHECK(gather_params_for(&dst, &dst, too_many).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the gather grid covers every word exactly once, at most 65,535 blocks",
          "[copy][gather]") {
  using namespace copy_kernels;
  const std::int64_t full = std::int64_t{gather_max_blocks} * gather_threads;
  for (const std::int64_t count :
       {std::int64_t{0}, std::int64_t{1}, std::int64_t{255}, std::int64_t{256}, std::int64_t{257},
        full - 1, full, full + 1, 3 * full + 17}) {
    INFO("words: " << count);
    const gather_launch g = gather_geometry(count);
    CHECK(g.threads == gather_threads);
    CHECK(g.blocks <= gather_max_blocks);
    CHECK(g.blocks == std::min<std::int64_t>((count + 255) / 256, gather_max_blocks));
    std::vector<std::uint8_t> seen(static_cast<std::size_t>(count), 0);
    const std::int64_t stride = gather_word_stride(g);
    for (int block = 0; block < g.blocks; ++block) {
      for (int thread = 0; thread < g.threads; ++thread) {
        for (std::int64_t i = gather_first_word(g, block, thread); i < count; i += stride) {
          ++seen[static_cast<std::size_t>(i)];
        }
      }
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](std::uint8_t n) { return n == 1; }));
  }
}

TEST_CASE("a load the GPU would make misaligned stops the simulated grid", "[copy][gather]") {
  // Parameters that ignore the source's alignment, as the gather chose them
  // before: complex64 moved as 8-byte words from an address at 4 mod 8.
  alignas(16) unsigned char src[64] = {};
  alignas(16) unsigned char dst[64] = {};
  gather_params p;
  p.ndim = 1;
  p.shape[0] = 2;
  p.strides[0] = 2;
  p.element_bytes = 8;
  p.word_bytes = 8;
  p.words_per_element = 1;
  p.count = 2;
  prepare_divisors(p);
  CHECK(run_gather_grid(p, src + 4, dst) == cuda::error::misaligned_address);
  p.word_bytes = copy_kernels::gather_word_bytes(reinterpret_cast<std::uintptr_t>(src + 4),
                                                 reinterpret_cast<std::uintptr_t>(dst), 8);
  p.words_per_element = 8 / p.word_bytes;
  p.count = 2 * p.words_per_element;
  prepare_divisors(p);
  CHECK(run_gather_grid(p, src + 4, dst) == cuda::error::success);
}

TEST_CASE("transposes take the tiled kernel, other layouts the plain gather", "[copy][gather]") {
  alignas(16) static unsigned char buffer[64];
  const auto tile_dim = [](const strided_layout& layout, std::size_t misalign = 0) {
    absl::StatusOr<gather_params> p = gather_params_for(buffer, buffer + misalign, layout);
    REQUIRE(p.ok());
    return p->tile_dim;
  };
  CHECK(tile_dim({4, {64, 48}, {1, 64}}) == 0);                // a transpose
  CHECK(tile_dim({4, {64, 48}, {1, -64}}) == 0);               // with reversed rows
  CHECK(tile_dim({4, {3, 40, 50}, {2000, 1, 40}}) == 1);       // batched
  CHECK(tile_dim({4, {40, 3, 50}, {1, 2000, 40}}) == 0);       // batch in the middle
  CHECK(tile_dim({2, {1, 64, 1, 48}, {999, 1, 7, 64}}) == 0);  // unit dimensions dropped
  CHECK(tile_dim({16, {16, 16}, {1, 16}}) == 0);
  CHECK(tile_dim({4, {48, 64}, {64, 1}}) == -1);     // compact: one run
  CHECK(tile_dim({4, {48, 64}, {80, 1}}) == -1);     // rows: coalesced already
  CHECK(tile_dim({4, {10, 64}, {1, 10}}) == -1);     // too few rows for tiles
  CHECK(tile_dim({4, {64, 15}, {1, 64}}) == -1);     // too few columns
  CHECK(tile_dim({4, {64, 48}, {1, 0}}) == -1);      // broadcast columns
  CHECK(tile_dim({4, {64, 48}, {2, 128}}) == -1);    // no contiguous dimension
  CHECK(tile_dim({8, {64, 48}, {1, 64}}, 4) == -1);  // two words an element
  CHECK(tile_dim({32, {64, 48}, {1, 64}}) == -1);    // two words an element
  absl::StatusOr<gather_params> empty = gather_params_for(buffer, buffer, {4, {0, 64}, {1, 0}});
  REQUIRE(empty.ok());
  CHECK(empty->count == 0);
  CHECK(empty->tile_dim == -1);
}

TEST_CASE("the tiled transpose matches the reference on ragged edges, for every word size",
          "[copy][gather]") {
  int tiled = 0;
  for (const std::size_t size : {1, 2, 4, 8, 16}) {
    for (const std::int64_t rows : {16, 31, 32, 33, 64, 70}) {
      for (const std::int64_t cols : {16, 17, 32, 45, 96}) {
        INFO("element " << size << ", " << rows << " x " << cols);
        // Transposed, transposed with padded columns, and with the columns
        // reversed.
        for (const std::int64_t col_stride : {rows, rows + 3, -rows}) {
          const gather_params p = check_gather({size, {rows, cols}, {1, col_stride}}, 0, 0);
          CHECK(p.tile_dim == 0);
          CHECK(p.words_per_element == 1);
          tiled += p.tile_dim == 0 ? 1 : 0;
        }
      }
    }
  }
  CHECK(tiled == 5 * 6 * 5 * 3);
}

TEST_CASE("the tiled transpose matches the reference on batches, in any dimension",
          "[copy][gather]") {
  for (const std::size_t size : {1, 4, 16}) {
    INFO("element " << size);
    // Batches outside: (b, r, c) read from [b][c][r].
    for (const std::int64_t batch : {2, 3}) {
      const gather_params p = check_gather({size, {batch, 33, 40}, {1320, 1, 33}}, 0, 0);
      CHECK(p.tile_dim == 1);
      CHECK(p.tiles == batch * 2 * 2);
    }
    // Batches between the tile's dimensions: (r, b, c) read from [b][c][r],
    // and from [c][b][r].
    CHECK(check_gather({size, {20, 3, 50}, {1, 1000, 20}}, 0, 0).tile_dim == 0);
    CHECK(check_gather({size, {20, 3, 50}, {1, 20, 60}}, 0, 0).tile_dim == 0);
    // Two batch dimensions, one reversed, one broadcast; and a 4-D
    // permutation (0, 3, 1, 2) of a compact [2][5][17][36] source.
    CHECK(check_gather({size, {2, 3, 36, 17}, {-612, 0, 1, 36}}, 0, 0).tile_dim == 2);
    CHECK(check_gather({size, {2, 36, 5, 17}, {3060, 1, 612, 36}}, 0, 0).tile_dim == 1);
  }
}

TEST_CASE("tiles of misaligned elements fall back to words the addresses allow", "[copy][gather]") {
  // complex64 at 4 mod 8 and complex128 at 8 mod 16: two words an element,
  // so the plain gather, which moves them aligned.
  CHECK(check_gather({8, {40, 40}, {1, 40}}, 4, 0).tile_dim == -1);
  CHECK(check_gather({16, {40, 40}, {1, 40}}, 8, 0).tile_dim == -1);
  // float32 misaligned by 2: halves are the words.
  CHECK(check_gather({4, {40, 40}, {1, 40}}, 2, 0).tile_dim == -1);
  // Aligned ones tile, with or without the destination at 16 bytes.
  CHECK(check_gather({8, {40, 40}, {1, 40}}, 8, 8).tile_dim == 0);
}

TEST_CASE("the simulated tiles stop where the GPU would fault", "[copy][gather]") {
  alignas(16) std::uint64_t src[48 * 48] = {};
  alignas(16) std::uint64_t dst[48 * 48] = {};
  absl::StatusOr<gather_params> p = gather_params_for(dst, src, {8, {48, 48}, {1, 48}});
  REQUIRE(p.ok());
  REQUIRE(p->tile_dim == 0);
  CHECK(run_gather_grid(*p, src, dst) == cuda::error::success);
  gather_params misaligned = *p;
  CHECK(run_gather_grid(misaligned, reinterpret_cast<char*>(src) + 4, dst) ==
        cuda::error::misaligned_address);
  // Rows that run past the destination.
  gather_params past = *p;
  past.dst_strides[0] = 49;
  CHECK(run_gather_grid(past, src, dst) == cuda::error::illegal_address);
}

}  // namespace dlasync::detail
