// The layout floor's arithmetic, case by case.
#include "transfer/src/layout/strided_layout.hpp"

#include <cstdint>
#include <limits>
#include <vector>

#include "catch2/catch.hpp"

namespace dlasync::detail {
namespace {

using dims = absl::InlinedVector<std::int64_t, 8>;
constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();

}  // namespace

TEST_CASE("row-major strides, saturating for huge empty tensors", "[transfer][layout]") {
  const std::vector<std::int64_t> shape{2, 3, 4};
  std::vector<std::int64_t> strides(3);
  row_major_strides(shape, strides);
  CHECK(strides == std::vector<std::int64_t>{12, 4, 1});
  // Extents of 0 count as 1, and a product past 64 bits saturates.
  const std::int64_t big = std::int64_t{1} << 40;
  const std::vector<std::int64_t> empty{4, big, big, 0};
  std::vector<std::int64_t> s(4);
  row_major_strides(empty, s);
  CHECK(s == std::vector<std::int64_t>{int64_max, big, 1, 1});
}

TEST_CASE("reach_of: below and above the first element, overflow-checked", "[transfer][layout]") {
  const std::vector<std::int64_t> shape{3, 4};
  const std::optional<element_reach> r =
      reach_of(shape, std::vector<std::int64_t>{-4, 1});  // rows reversed
  REQUIRE(r.has_value());
  CHECK(r->low == -8);
  CHECK(r->high == 3);
  // Extents of 1 reach nothing, whatever their stride.
  const std::optional<element_reach> one =
      reach_of(std::vector<std::int64_t>{1, 5}, std::vector<std::int64_t>{int64_max, 1});
  REQUIRE(one.has_value());
  CHECK(one->high == 4);
  CHECK_FALSE(reach_of(std::vector<std::int64_t>{3}, std::vector<std::int64_t>{int64_max / 2 + 1})
                  .has_value());
  CHECK_FALSE(reach_of(std::vector<std::int64_t>{2, 2},
                       std::vector<std::int64_t>{int64_max / 2 + 1, int64_max / 2 + 1})
                  .has_value());
}

TEST_CASE("simplify drops unit extents and merges contiguous dimensions", "[transfer][layout]") {
  // Compact: one run.
  strided_layout compact = simplify({4, {2, 3, 4}, {12, 4, 1}});
  CHECK(compact.element_size == 4);
  CHECK(compact.shape == dims{24});
  CHECK(compact.strides == dims{1});
  // Unit extents with odd strides vanish.
  strided_layout units = simplify({2, {2, 1, 3, 4}, {12, 99, 4, 1}});
  CHECK(units.shape == dims{24});
  // A transpose stays two dimensions.
  strided_layout t = simplify({4, {1024, 1024}, {1, 1024}});
  CHECK(t.shape == dims{1024, 1024});
  CHECK(t.strides == dims{1, 1024});
  // Rows of a wider matrix: the rows merge no further than their gaps allow.
  strided_layout rows = simplify({1, {4, 2, 8}, {32, 8, 1}});
  CHECK(rows.shape == dims{4, 16});
  CHECK(rows.strides == dims{32, 1});
  // Broadcast and reversed dimensions merge where contiguous.
  strided_layout broadcast = simplify({8, {5, 3}, {0, 1}});
  CHECK(broadcast.shape == dims{5, 3});
  CHECK(broadcast.strides == dims{0, 1});
  strided_layout reversed = simplify({8, {2, 3}, {-3, -1}});
  CHECK(reversed.shape == dims{6});
  CHECK(reversed.strides == dims{-1});
  // A single element, an empty tensor.
  strided_layout single = simplify({4, {1, 1}, {7, 9}});
  CHECK(single.shape == dims{1});
  CHECK(single.strides == dims{1});
  strided_layout empty = simplify({4, {std::int64_t{1} << 60, 0}, {int64_max, 1}});
  CHECK(empty.shape == dims{0});
  // A merge that would overflow is not made.
  strided_layout far = simplify({1, {2, 4}, {int64_max / 2 + 1, int64_max / 8}});
  CHECK(far.shape.size() == 2);
  // What simplify returns is simplified; what it changes was not.
  for (const strided_layout* l :
       {&compact, &units, &t, &rows, &broadcast, &reversed, &single, &empty, &far}) {
    CHECK(is_simplified(*l));
  }
  CHECK_FALSE(is_simplified({4, {2, 3, 4}, {12, 4, 1}}));
  CHECK_FALSE(is_simplified({2, {2, 1, 3}, {3, 99, 1}}));
  CHECK_FALSE(is_simplified({4, {1, 1}, {7, 9}}));
  CHECK_FALSE(is_simplified({4, {}, {}}));
  // Simplifying again changes nothing.
  const strided_layout twice = simplify(rows);
  CHECK(twice.shape == rows.shape);
  CHECK(twice.strides == rows.strides);
}

TEST_CASE("innermost_run covers the contiguous dimensions from the last", "[transfer][layout]") {
  const std::vector<std::int64_t> shape{4, 2, 1, 8};
  const run_shape r = innermost_run(shape, std::vector<std::int64_t>{64, 8, 5, 1}, 4);
  CHECK(r.inner_dims == 3);
  CHECK(r.bytes == 2 * 8 * 4);
  const run_shape none =
      innermost_run(std::vector<std::int64_t>{4, 8}, std::vector<std::int64_t>{1, 4}, 2);
  CHECK(none.inner_dims == 0);
  CHECK(none.bytes == 2);
  const run_shape all =
      innermost_run(std::vector<std::int64_t>{4, 8}, std::vector<std::int64_t>{8, 1}, 1);
  CHECK(all.inner_dims == 2);
  CHECK(all.bytes == 32);
}

TEST_CASE("fills_span: each element of the span once, in any order", "[transfer][layout]") {
  CHECK(fills_span(std::vector<std::int64_t>{4, 8}, std::vector<std::int64_t>{8, 1}));
  CHECK(fills_span(std::vector<std::int64_t>{4, 8}, std::vector<std::int64_t>{1, 4}));
  CHECK(fills_span(std::vector<std::int64_t>{4, 8}, std::vector<std::int64_t>{-8, -1}));
  CHECK(fills_span(std::vector<std::int64_t>{1, 8}, std::vector<std::int64_t>{0, 1}));
  CHECK_FALSE(fills_span(std::vector<std::int64_t>{4, 8}, std::vector<std::int64_t>{0, 1}));
  CHECK_FALSE(fills_span(std::vector<std::int64_t>{4, 8}, std::vector<std::int64_t>{16, 1}));
  CHECK_FALSE(fills_span(std::vector<std::int64_t>{4, 8}, std::vector<std::int64_t>{4, 1}));
}

TEST_CASE("byte_extent_of and compact_bytes", "[transfer][layout]") {
  const byte_extent e = byte_extent_of({4, {3, 4}, {-4, 1}});
  CHECK(e.offset == -32);
  CHECK(e.length == 12 * 4);
  const byte_extent sparse = byte_extent_of({2, {3}, {10}});
  CHECK(sparse.offset == 0);
  CHECK(sparse.length == 21 * 2);
  const byte_extent broadcast = byte_extent_of({8, {100}, {0}});
  CHECK(broadcast.length == 8);
  const byte_extent empty = byte_extent_of({4, {5, 0}, {int64_max, 1}});
  CHECK(empty.length == 0);
  CHECK(compact_bytes({4, {3, 5}, {1, 3}}) == 60);
  CHECK(compact_bytes({4, {3, 0}, {1, 3}}) == 0);
}

}  // namespace dlasync::detail
