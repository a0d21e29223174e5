// The simulation's stream-order race checker: unordered conflicting device
// accesses, host uses of memory that device work may still touch, and the
// orderings that make them safe (event waits, host synchronization, one
// stream's program order). Reports do not depend on timing: each case is
// decided when the calls are made.
#include "runtime/sim/sim_checker.hpp"

#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"
#include "support/runtime_fixture.hpp"
#include "support/sim_reports.hpp"

namespace dlasync::cuda {
namespace {

using testing::require_reports;

stream_t new_stream(sim_api& sim, int device) {
  REQUIRE(sim.set_device(device) == error::success);
  stream_t s = nullptr;
  REQUIRE(sim.stream_create(&s, stream_flags::non_blocking) == error::success);
  return s;
}

// Records an event on `s` of `device`; the caller waits or queries it.
event_t record(sim_api& sim, int device, stream_t s) {
  REQUIRE(sim.set_device(device) == error::success);
  event_t e = nullptr;
  REQUIRE(sim.event_create(&e) == error::success);
  REQUIRE(sim.event_record(e, s) == error::success);
  return e;
}

void wait_on_host(sim_api& sim, event_t e) {
  REQUIRE(testing::eventually([&] { return sim.event_query(e) != error::not_ready; }));
  REQUIRE(sim.event_query(e) == error::success);
}

struct two_streams {
  sim_api sim;
  stream_t a = new_stream(sim, 0);
  stream_t b = new_stream(sim, 0);
  void* x = nullptr;  // device memory of cuda:0, usable on any stream
  void* y = nullptr;
  void* pinned = nullptr;

  explicit two_streams(sim_options so = {}) : sim(so) {
    REQUIRE(sim.set_device(0) == error::success);
    REQUIRE(sim.malloc_device(&x, 4096) == error::success);
    REQUIRE(sim.malloc_device(&y, 4096) == error::success);
    REQUIRE(sim.malloc_host(&pinned, 4096) == error::success);
  }
  // Holds stream `s` until the returned promise is set: the checker decides
  // at the call, and a held stream keeps the simulation's host threads from
  // racing on the bytes themselves (ThreadSanitizer would say so).
  std::promise<void> hold(stream_t s) {
    std::promise<void> gate;
    std::shared_future<void> opened = gate.get_future().share();
    REQUIRE(sim.launch_host_func(s, [opened] { opened.wait(); }) == error::success);
    return gate;
  }
  ~two_streams() {
    wait_on_host(sim, record(sim, 0, a));
    wait_on_host(sim, record(sim, 0, b));
    (void)sim.free_device(x);
    (void)sim.free_device(y);
    (void)sim.free_host(pinned);
    (void)sim.stream_destroy(a);
    (void)sim.stream_destroy(b);
  }
};

}  // namespace

TEST_CASE("two streams writing the same bytes without an event between them race",
          "[cuda][sim][checker]") {
  two_streams t;
  // Stream a is held back until b's copy has run; no event orders the two.
  std::promise<void> gate = t.hold(t.a);
  REQUIRE(t.sim.memcpy_async(t.x, t.pinned, 1024, memcpy_kind::host_to_device, t.a) ==
          error::success);
  REQUIRE(t.sim.memcpy_async(static_cast<char*>(t.x) + 512, t.y, 1024,
                             memcpy_kind::device_to_device, t.b) == error::success);
  const auto reports = require_reports(
      t.sim, 1,
      {"race: cudaMemcpyAsync (device to device", "writes", "while cudaMemcpyAsync (host to device",
       "sim_checker_test.cpp", "no event wait or host synchronization"});
  CHECK(reports.size() == 1);
  wait_on_host(t.sim, record(t.sim, 0, t.b));
  gate.set_value();
  // Once the host has seen both done, reads of the same bytes on both
  // streams do not conflict.
  wait_on_host(t.sim, record(t.sim, 0, t.a));
  wait_on_host(t.sim, record(t.sim, 0, t.b));
  REQUIRE(t.sim.memcpy_async(t.y, t.x, 64, memcpy_kind::device_to_device, t.a) == error::success);
  REQUIRE(t.sim.memcpy_async(static_cast<char*>(t.y) + 2048, t.x, 64, memcpy_kind::device_to_device,
                             t.b) == error::success);
  CHECK(t.sim.take_reports().empty());
}

TEST_CASE("an event wait, a host synchronization or one stream orders accesses",
          "[cuda][sim][checker]") {
  two_streams t;
  // Program order of one stream.
  REQUIRE(t.sim.memcpy_async(t.x, t.pinned, 1024, memcpy_kind::host_to_device, t.a) ==
          error::success);
  REQUIRE(t.sim.memcpy_async(t.y, t.x, 1024, memcpy_kind::device_to_device, t.a) == error::success);
  // An event recorded on a and waited for by b.
  event_t e = record(t.sim, 0, t.a);
  REQUIRE(t.sim.stream_wait_event(t.b, e) == error::success);
  REQUIRE(t.sim.memcpy_async(t.x, t.y, 1024, memcpy_kind::device_to_device, t.b) == error::success);
  // The host saw b's work complete: later work on a follows it.
  wait_on_host(t.sim, record(t.sim, 0, t.b));
  REQUIRE(t.sim.memcpy_async(t.pinned, t.x, 1024, memcpy_kind::device_to_host, t.a) ==
          error::success);
  CHECK(t.sim.take_reports().empty());
}

TEST_CASE("the host releasing memory that a copy may still read is reported",
          "[cuda][sim][checker]") {
  sim_options so;
  so.min_op_us = 20000;  // the copy is still running when the host acts
  two_streams t(so);
  REQUIRE(t.sim.memcpy_async(t.x, t.pinned, 4096, memcpy_kind::host_to_device, t.a) ==
          error::success);
  t.sim.host_access(t.pinned, 4096, host_use::write, "the host refills the buffer");
  require_reports(
      t.sim, 1,
      {"race: the host writes", "the host refills the buffer",
       "while cudaMemcpyAsync (host to device, 4096 bytes)", "reads", "has not seen complete"});
  t.sim.host_access(t.pinned, 4096, host_use::read, "the host reads the buffer");
  CHECK(t.sim.take_reports().empty());  // reads after reads are fine
  event_t e = record(t.sim, 0, t.a);
  wait_on_host(t.sim, e);
  t.sim.host_access(t.pinned, 4096, host_use::release, "the host frees the buffer");
  CHECK(t.sim.take_reports().empty());
}

TEST_CASE("stream-ordered memory used on another stream before its allocation is ordered",
          "[cuda][sim][checker]") {
  two_streams t;
  void* p = nullptr;
  REQUIRE(t.sim.malloc_async(&p, 1024, t.a) == error::success);
  REQUIRE(t.sim.memcpy_async(p, t.pinned, 1024, memcpy_kind::host_to_device, t.b) ==
          error::success);
  require_reports(t.sim, 1, {"race", "cudaMallocAsync (1024 bytes)", "allocates"});
  event_t e = record(t.sim, 0, t.a);
  REQUIRE(t.sim.stream_wait_event(t.b, e) == error::success);
  REQUIRE(t.sim.memcpy_async(p, t.pinned, 1024, memcpy_kind::host_to_device, t.b) ==
          error::success);
  CHECK(t.sim.take_reports().empty());
  // Freed on a while b's copy is not ordered before the free.
  REQUIRE(t.sim.free_async(p, t.a) == error::success);
  // Both of b's copies write it.
  require_reports(t.sim, 2, {"race: cudaFreeAsync (1024 bytes)", "frees", "writes"});
}

TEST_CASE("a deleter's check looks at its own copy's work only", "[cuda][sim][checker]") {
  sim_options so;
  so.min_op_us = 20000;
  two_streams t(so);
  {
    const owner_scope mine(41);
    REQUIRE(t.sim.memcpy_async(t.y, t.x, 1024, memcpy_kind::device_to_device, t.a) ==
            error::success);
  }
  {
    const owner_scope other(42);
    REQUIRE(t.sim.memcpy_async(t.pinned, t.x, 1024, memcpy_kind::device_to_host, t.b) ==
            error::success);
  }
  t.sim.host_access(t.x, 1024, host_use::release, "deleter of copy 42", 42);
  require_reports(t.sim, 1, {"deleter of copy 42", "(device to host"});
  t.sim.host_access(t.x, 1024, host_use::release, "deleter of copy 43", 43);
  CHECK(t.sim.take_reports().empty());
}

TEST_CASE("records the host knows complete are dropped", "[cuda][sim][checker]") {
  two_streams t;
  for (int i = 0; i < 600; ++i) {
    REQUIRE(t.sim.memcpy_async(static_cast<char*>(t.x) + (i % 4) * 1024, t.pinned, 1024,
                               memcpy_kind::host_to_device, t.a) == error::success);
    if (i % 50 == 49) wait_on_host(t.sim, record(t.sim, 0, t.a));
  }
  wait_on_host(t.sim, record(t.sim, 0, t.a));
  CHECK(t.sim.checker_records() < 300);
  CHECK(t.sim.take_reports().empty());
}

TEST_CASE("with the checker off only rules are reported", "[cuda][sim][checker]") {
  sim_options so;
  so.check_order = false;
  two_streams t(so);
  // Held as in the race case: with the checker off nothing reports the race,
  // but the host threads would still race on the bytes.
  std::promise<void> gate = t.hold(t.a);
  REQUIRE(t.sim.memcpy_async(t.x, t.pinned, 1024, memcpy_kind::host_to_device, t.a) ==
          error::success);
  REQUIRE(t.sim.memcpy_async(t.x, t.y, 1024, memcpy_kind::device_to_device, t.b) == error::success);
  CHECK(t.sim.take_reports().empty());
  wait_on_host(t.sim, record(t.sim, 0, t.b));
  gate.set_value();
  CHECK(t.sim.memcpy_async(t.x, t.y, 8, memcpy_kind::host_to_host, t.b) == error::invalid_value);
  require_reports(t.sim, 1, {"rule: cudaMemcpyAsync"});
}

}  // namespace dlasync::cuda
