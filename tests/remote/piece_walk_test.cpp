// How an exporter cuts a tensor's bytes into pieces (plan_remote.hpp's
// piece_walk), which the importer checks each arriving piece against.
#include <cstdint>
#include <memory>
#include <vector>

#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "dlasync/remote.hpp"
#include "remote/src/plan_remote.hpp"
#include "support/runtime_fixture.hpp"

namespace dlasync {
namespace {

using remote_detail::max_piece_bytes;
using remote_detail::piece_plan;
using remote_detail::piece_walk;

// A host tensor of uint8 `shape` and `strides` at a made-up exporter
// address, its region its span.
remote_descriptor described(std::vector<std::int64_t> shape, std::vector<std::int64_t> strides) {
  remote_descriptor d;
  d.lease_id = 1;
  d.type = dtypes::uint8;
  d.shape = std::move(shape);
  d.strides = std::move(strides);
  d.data = 0x10000000;
  d.region_begin = d.data;
  std::int64_t last = 0;
  for (std::size_t k = 0; k < d.shape.size(); ++k) last += (d.shape[k] - 1) * d.strides[k];
  d.region_bytes = d.shape.empty() ? 1 : static_cast<std::uint64_t>(last) + 1;
  d.exporter_address = "127.0.0.1";
  d.exporter_port = 1;
  return d;
}

TEST_CASE("a whole or dense span goes in pieces of max_piece_bytes, back to back",
          "[remote][pieces]") {
  const std::unique_ptr<runtime> rt = testing::make_runtime();
  const auto walk_of = [&](const remote_descriptor& d, piece_plan plan) {
    absl::StatusOr<remote_detail::remote_plan> p =
        remote_detail::plan_remote(d, {}, rt->registry());
    REQUIRE(p.ok());
    REQUIRE(piece_walk::fits(d, *p, plan));
    return std::make_pair(piece_walk(d, *p, plan), *p);
  };
  const std::int64_t piece = static_cast<std::int64_t>(max_piece_bytes);

  SECTION("a compact tensor of two pieces and three bytes") {
    const remote_descriptor d = described({2 * piece + 3}, {1});
    const auto [walk, p] = walk_of(d, piece_plan::whole);
    REQUIRE(walk.count() == 3);
    for (std::uint64_t i = 0; i < 3; ++i) {
      const remote_detail::piece_range r = walk.at(i);
      CHECK(r.offset == i * max_piece_bytes);
      CHECK(r.source == d.data + i * max_piece_bytes);
      CHECK(r.length == (i < 2 ? max_piece_bytes : 3));
    }
  }
  SECTION("exactly one piece's bytes, and fewer, go as one piece") {
    for (const std::int64_t n : {piece, std::int64_t{1}, std::int64_t{65536}}) {
      const auto [walk, p] = walk_of(described({n}, {1}), piece_plan::whole);
      REQUIRE(walk.count() == 1);
      CHECK(walk.at(0).length == static_cast<std::uint64_t>(n));
    }
  }
  SECTION("a transposed span, dense, in pieces of the span") {
    // [2, piece] stored column-major: the span holds each element once.
    const remote_descriptor d = described({2, piece}, {1, 2});
    const auto [walk, p] = walk_of(d, piece_plan::dense);
    REQUIRE(walk.count() == 2);
    CHECK(walk.at(1).source == p.span_begin + max_piece_bytes);
    CHECK(walk.at(1).offset + walk.at(1).length == p.span_bytes);
  }
  SECTION("a gathered copy goes in pieces of max_piece_bytes too, and an empty tensor has none") {
    // Every other byte: gaps, so gathered. Before: one piece, whatever its
    // size, so a large copy gave no sign of life until it was all there.
    const remote_descriptor gappy = described({2 * piece + 5}, {2});
    const auto [gathered, p] = walk_of(gappy, piece_plan::gathered);
    REQUIRE(gathered.count() == 3);
    for (std::uint64_t i = 0; i < 3; ++i) {
      const remote_detail::piece_range r = gathered.at(i);
      CHECK(r.offset == i * max_piece_bytes);
      CHECK(r.source == r.offset);  // from the exporter's copy
      CHECK(r.length == (i < 2 ? max_piece_bytes : 5));
    }
    const auto [small, s] = walk_of(described({100}, {2}), piece_plan::gathered);
    CHECK(small.count() == 1);
    CHECK(small.at(0).length == 100);
    const auto [empty, q] = walk_of(described({0}, {1}), piece_plan::whole);
    CHECK(empty.count() == 0);
  }
  rt->shutdown();
}

}  // namespace
}  // namespace dlasync
