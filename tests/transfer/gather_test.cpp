// The gather kernel of the CUDA seam, run by the simulation (on a real GPU
// the [gpu] scenarios run the nvcc-built kernel).
#include "transfer/src/copy/gather.hpp"

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

}  // namespace dlasync::cuda
