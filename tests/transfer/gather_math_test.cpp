// The gather kernel's arithmetic, as the GPU runs it (gather_math.hpp is
// compiled into the CUDA kernel as well): word sizes from the actual
// alignment, the index math against a plain reference for every word size,
// up to 64 dimensions, negative and zero strides, and a launch geometry that
// covers every word exactly once.
#include "transfer/src/copy/gather_math.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "catch2/catch.hpp"
#include "transfer/src/copy/gather.hpp"

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
// `dst_misalign`; checks the bytes against the reference.
void check_gather(const strided_layout& layout, std::size_t misalign, std::size_t dst_misalign) {
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
  auto* aligned = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(storage.data()) + 31) / 32 * 32);
  for (std::size_t i = 0; i < span + 32; ++i) aligned[i] = static_cast<unsigned char>(i * 37 + 11);
  const unsigned char* src = aligned + misalign - low * element;

  std::vector<unsigned char> out_storage(static_cast<std::size_t>(elements * element) + 64);
  auto* dst = reinterpret_cast<unsigned char*>(
                  (reinterpret_cast<std::uintptr_t>(out_storage.data()) + 31) / 32 * 32) +
              dst_misalign;
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
  CHECK(run_gather_grid(p, src + 4, dst) == cuda::error::misaligned_address);
  p.word_bytes = copy_kernels::gather_word_bytes(reinterpret_cast<std::uintptr_t>(src + 4),
                                                 reinterpret_cast<std::uintptr_t>(dst), 8);
  p.words_per_element = 8 / p.word_bytes;
  p.count = 2 * p.words_per_element;
  CHECK(run_gather_grid(p, src + 4, dst) == cuda::error::success);
}

}  // namespace dlasync::detail
