// The gather kernel of the CUDA seam, run by the simulation (on a real GPU
// the [gpu] scenarios run the nvcc-built kernel).
#include "transfer/src/kernels/gather.hpp"

#include <cstdint>
#include <cstring>

#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"
#include "support/runtime_fixture.hpp"
#include "support/sim_reports.hpp"

namespace dlasync::cuda {

TEST_CASE("the gather kernel compacts device tensors on a simulated GPU", "[cuda][copy]") {
  sim_api sim;
  REQUIRE(sim.set_device(0) == error::success);
  stream_t s = nullptr;
  REQUIRE(sim.stream_create(&s, stream_flags::non_blocking) == error::success);
  void* src = nullptr;
  void* dst = nullptr;
  REQUIRE(sim.malloc_async(&src, 6 * sizeof(int), s) == error::success);
  REQUIRE(sim.malloc_async(&dst, 6 * sizeof(int), s) == error::success);
  for (int i = 0; i < 6; ++i) static_cast<int*>(src)[i] = i;
  REQUIRE(dlasync::detail::launch_gather(sim, dst, src, {4, {3, 2}, {1, 3}}, s) == error::success);
  event_t e = nullptr;
  sim.event_create(&e);
  sim.event_record(e, s);
  CHECK(testing::eventually([&] { return sim.event_query(e) == error::success; }));
  const int want[6] = {0, 3, 1, 4, 2, 5};
  CHECK(std::memcmp(dst, want, sizeof want) == 0);
  int host = 0;
  CHECK(dlasync::detail::launch_gather(sim, &host, src, {4, {1}, {1}}, s) == error::invalid_value);
  testing::require_reports(sim, 1, {"dlasyncGatherKernel", "is not live device memory"});
  sim.free_async(src, s);
  sim.free_async(dst, s);
  sim.event_destroy(e);
  sim.stream_destroy(s);
}

TEST_CASE("the tiled transpose compacts device tensors on a simulated GPU", "[cuda][copy]") {
  sim_api sim;
  REQUIRE(sim.set_device(0) == error::success);
  stream_t s = nullptr;
  REQUIRE(sim.stream_create(&s, stream_flags::non_blocking) == error::success);
  // A batch of 3 matrices of 40 x 70 doubles, read from [b][c][r]: ragged
  // tiles on both edges.
  constexpr std::int64_t batch = 3, rows = 40, cols = 70;
  constexpr std::size_t n = batch * rows * cols;
  void* src = nullptr;
  void* dst = nullptr;
  REQUIRE(sim.malloc_async(&src, n * sizeof(double), s) == error::success);
  REQUIRE(sim.malloc_async(&dst, n * sizeof(double), s) == error::success);
  for (std::size_t i = 0; i < n; ++i) static_cast<double*>(src)[i] = static_cast<double>(i);
  const strided_layout layout{8, {batch, rows, cols}, {rows * cols, 1, rows}};
  absl::StatusOr<copy_kernels::gather_params> p =
      dlasync::detail::gather_params_for(dst, src, layout);
  REQUIRE(p.ok());
  CHECK(p->tile_dim == 1);
  REQUIRE(dlasync::detail::launch_gather(sim, dst, src, layout, s) == error::success);
  event_t e = nullptr;
  sim.event_create(&e);
  sim.event_record(e, s);
  CHECK(testing::eventually([&] { return sim.event_query(e) == error::success; }));
  std::size_t wrong = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const double want = static_cast<double>(b * rows * cols + c * rows + r);
        wrong += static_cast<const double*>(dst)[(b * rows + r) * cols + c] != want ? 1 : 0;
      }
    }
  }
  CHECK(wrong == 0);
  CHECK(sim.sticky_error() == error::success);
  sim.free_async(src, s);
  sim.free_async(dst, s);
  sim.event_destroy(e);
  sim.stream_destroy(s);
}

}  // namespace dlasync::cuda
