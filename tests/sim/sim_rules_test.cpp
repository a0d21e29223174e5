// CUDA's rules as the simulation enforces them: each test breaks one rule
// and checks the error cudart returns and the report that names it, or
// checks a behaviour of the hardware the simulation reproduces (the legacy
// stream's implicit synchronization, per-thread streams, the last error,
// contexts). docs/cuda.md lists the rules with their sources.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"
#include "support/runtime_fixture.hpp"
#include "support/sim_reports.hpp"

namespace dlasync::cuda {
namespace {

using namespace std::chrono_literals;
using testing::require_reports;

stream_t new_stream(sim_api& sim, int device, stream_flags flags = stream_flags::non_blocking) {
  REQUIRE(sim.set_device(device) == error::success);
  stream_t s = nullptr;
  REQUIRE(sim.stream_create(&s, flags) == error::success);
  return s;
}

event_t new_event(sim_api& sim, int device) {
  REQUIRE(sim.set_device(device) == error::success);
  event_t e = nullptr;
  REQUIRE(sim.event_create(&e) == error::success);
  return e;
}

// Waits on the host for `s` (of `device`), as cudaStreamSynchronize does.
void synchronize(sim_api& sim, int device, stream_t s) {
  event_t e = new_event(sim, device);
  REQUIRE(sim.event_record(e, s) == error::success);
  REQUIRE(testing::eventually([&] { return sim.event_query(e) != error::not_ready; }));
  REQUIRE(sim.event_query(e) == error::success);
  REQUIRE(sim.event_destroy(e) == error::success);
}

stream_t legacy() {
  return reinterpret_cast<stream_t>(1);
}
stream_t per_thread() {
  return reinterpret_cast<stream_t>(2);
}

// A kernel writing `n` bytes of `value` at `out`, reading `in` (if any),
// or faulting with `fault` as it runs.
struct test_kernel final : device_kernel {
  test_kernel(void* out, std::size_t n, const void* in = nullptr, error fault = error::success)
      : out_(out), n_(n), in_(in), fault_(fault) {}
  const char* name() const noexcept override { return "testKernel"; }
  void* output() const noexcept override { return out_; }
  std::uint64_t output_bytes() const noexcept override { return n_; }
  std::vector<memory_range> inputs() const override {
    if (in_ == nullptr) return {};
    return {{in_, n_}};
  }
  error launch(stream_t) const override { return error::unknown; }  // never on a simulation
  error simulate() const override {
    if (fault_ != error::success) return fault_;
    std::memset(out_, 7, n_);
    return error::success;
  }
  void* out_;
  std::size_t n_;
  const void* in_;
  error fault_;
};

}  // namespace

TEST_CASE("an event recorded on a stream of another device fails with an invalid handle",
          "[cuda][sim][rules]") {
  sim_api sim;
  stream_t s0 = new_stream(sim, 0);
  event_t e1 = new_event(sim, 1);
  CHECK(sim.event_record(e1, s0) == error::invalid_resource_handle);
  require_reports(sim, 1,
                  {"rule: cudaEventRecord", "cudaErrorInvalidResourceHandle",
                   "the event belongs to cuda:1", "of cuda:0", "sim_rules_test.cpp"});
  // A wait across devices is allowed.
  stream_t s1 = new_stream(sim, 1);
  REQUIRE(sim.event_record(e1, s1) == error::success);
  REQUIRE(sim.set_device(0) == error::success);
  CHECK(sim.stream_wait_event(s0, e1) == error::success);
  synchronize(sim, 0, s0);
  REQUIRE(sim.event_destroy(e1) == error::success);
  REQUIRE(sim.stream_destroy(s0) == error::success);
  REQUIRE(sim.stream_destroy(s1) == error::success);
}

TEST_CASE("a kernel launched on a stream of a device that is not current fails",
          "[cuda][sim][rules]") {
  sim_api sim;
  stream_t s0 = new_stream(sim, 0);
  void* out = nullptr;
  REQUIRE(sim.malloc_device(&out, 64) == error::success);
  REQUIRE(sim.set_device(1) == error::success);
  CHECK(sim.launch_kernel(std::make_shared<test_kernel>(out, 64), s0) ==
        error::invalid_resource_handle);
  require_reports(sim, 1,
                  {"rule: testKernel", "cudaErrorInvalidResourceHandle", "while cuda:1 is current",
                   "make the stream's device current"});
  // A copy may be issued to a stream of another device.
  std::vector<char> host(64, 1);
  CHECK(sim.memcpy_async(out, host.data(), 64, memcpy_kind::host_to_device, s0) == error::success);
  REQUIRE(sim.set_device(0) == error::success);
  CHECK(sim.launch_kernel(std::make_shared<test_kernel>(out, 64), s0) == error::success);
  synchronize(sim, 0, s0);
  CHECK(static_cast<char*>(out)[63] == 7);
  REQUIRE(sim.free_device(out) == error::success);
  REQUIRE(sim.stream_destroy(s0) == error::success);
}

TEST_CASE("stream-ordered memory comes from the stream's device and needs pool access elsewhere",
          "[cuda][sim][rules]") {
  sim_api sim;
  stream_t s0 = new_stream(sim, 0);
  stream_t s1 = new_stream(sim, 1);
  // Allocated on cuda:1's stream while cuda:0 is current: memory of cuda:1.
  REQUIRE(sim.set_device(0) == error::success);
  void* pool1 = nullptr;
  REQUIRE(sim.malloc_async(&pool1, 256, s1) == error::success);
  pointer_attributes a;
  REQUIRE(sim.pointer_get_attributes(&a, pool1) == error::success);
  CHECK(a.type == memory_type::device);
  CHECK(a.device == 1);
  synchronize(sim, 1, s1);
  void* plain0 = nullptr;
  REQUIRE(sim.set_device(0) == error::success);
  REQUIRE(sim.malloc_device(&plain0, 256) == error::success);

  // Copied on a stream of cuda:0 without pool access: refused.
  REQUIRE(sim.set_device(0) == error::success);
  CHECK(sim.memcpy_async(plain0, pool1, 256, memcpy_kind::any, s0) == error::invalid_value);
  require_reports(
      sim, 1, {"rule: cudaMemcpyAsync", "pool memory of cuda:1", "without cudaMemPoolSetAccess"});
  // Pool memory is copied with its stream's device current.
  REQUIRE(sim.set_device(1) == error::success);
  CHECK(sim.memcpy_async(plain0, pool1, 256, memcpy_kind::any, s0) == error::invalid_value);
  require_reports(sim, 1, {"rule: cudaMemcpyAsync", "make the stream's device current"});
  // Peer access does not reach the pool; pool access does.
  REQUIRE(sim.set_device(0) == error::success);
  REQUIRE(sim.device_enable_peer_access(1) == error::success);
  CHECK(sim.memcpy_async(plain0, pool1, 256, memcpy_kind::any, s0) == error::invalid_value);
  require_reports(sim, 1, {"without cudaMemPoolSetAccess"});
  REQUIRE(sim.mem_pool_set_access(1, 0) == error::success);
  CHECK(sim.memcpy_async(plain0, pool1, 256, memcpy_kind::any, s0) == error::success);
  synchronize(sim, 0, s0);

  REQUIRE(sim.set_device(1) == error::success);
  REQUIRE(sim.free_async(pool1, s1) == error::success);
  REQUIRE(sim.free_device(plain0) == error::success);
  REQUIRE(sim.stream_destroy(s0) == error::success);
  REQUIRE(sim.stream_destroy(s1) == error::success);
}

TEST_CASE("destroyed streams and events are invalid handles", "[cuda][sim][rules]") {
  sim_api sim;
  stream_t s = new_stream(sim, 0);
  event_t e = new_event(sim, 0);
  REQUIRE(sim.stream_destroy(s) == error::success);
  REQUIRE(sim.event_destroy(e) == error::success);
  CHECK(sim.stream_destroy(s) == error::invalid_resource_handle);
  CHECK(sim.event_record(e, legacy()) == error::invalid_resource_handle);
  CHECK(sim.launch_host_func(s, [] {}) == error::invalid_resource_handle);
  CHECK(sim.event_destroy(e) == error::invalid_resource_handle);
  require_reports(sim, 4, {"cudaErrorInvalidResourceHandle", "names no live"});
}

TEST_CASE("double frees and frees of memory never allocated fail with an invalid value",
          "[cuda][sim][rules]") {
  sim_api sim;
  stream_t s = new_stream(sim, 0);
  void* p = nullptr;
  REQUIRE(sim.malloc_async(&p, 64, s) == error::success);
  REQUIRE(sim.free_async(p, s) == error::success);
  CHECK(sim.free_async(p, s) == error::invalid_value);
  require_reports(sim, 1, {"rule: cudaFreeAsync", "double free"});
  int local = 0;
  CHECK(sim.free_device(&local) == error::invalid_value);
  require_reports(sim, 1, {"rule: cudaFree", "never allocated"});
  void* pinned = nullptr;
  REQUIRE(sim.malloc_host(&pinned, 64) == error::success);
  CHECK(sim.free_device(pinned) == error::invalid_value);
  require_reports(sim, 1, {"rule: cudaFree", "free it with cudaFreeHost"});
  REQUIRE(sim.free_host(pinned) == error::success);
  CHECK(sim.free_host(pinned) == error::invalid_value);
  require_reports(sim, 1, {"rule: cudaFreeHost", "no page-locked allocation"});
  void* inner = nullptr;
  REQUIRE(sim.malloc_device(&inner, 64) == error::success);
  CHECK(sim.free_async(static_cast<char*>(inner) + 8, s) == error::invalid_value);
  require_reports(sim, 1, {"inside an allocation, not at its start"});
  REQUIRE(sim.free_device(inner) == error::success);
  REQUIRE(sim.stream_destroy(s) == error::success);
}

TEST_CASE("memory is not used once its free is ordered", "[cuda][sim][rules]") {
  sim_options so;
  so.min_op_us = 2000;  // the free stays queued behind the copy for a while
  sim_api sim(so);
  stream_t s = new_stream(sim, 0);
  void* p = nullptr;
  void* other = nullptr;
  REQUIRE(sim.malloc_async(&p, 256, s) == error::success);
  REQUIRE(sim.malloc_async(&other, 256, s) == error::success);
  REQUIRE(sim.memcpy_async(other, p, 256, memcpy_kind::any, s) == error::success);
  REQUIRE(sim.free_async(p, s) == error::success);
  // Still queued, and already gone: ordered after its free.
  CHECK(sim.memcpy_async(other, p, 256, memcpy_kind::any, s) == error::invalid_value);
  require_reports(sim, 1, {"use after free", "whose free was already ordered"});
  synchronize(sim, 0, s);
  // Freed and quarantined: still reported, never read as reused memory.
  CHECK(sim.memcpy_async(other, p, 256, memcpy_kind::any, s) == error::invalid_value);
  require_reports(sim, 1, {"use after free"});
  REQUIRE(sim.launch_kernel(std::make_shared<test_kernel>(other, 256, p), s) == error::success);
  require_reports(sim, 1, {"rule: testKernel", "cudaErrorIllegalAddress", "use after free"});
  CHECK(testing::eventually([&] { return sim.sticky_error() == error::illegal_address; }));
  sim.clear_faults();
}

TEST_CASE("the legacy default stream serializes with blocking streams, not non-blocking ones",
          "[cuda][sim][rules]") {
  sim_api sim;
  stream_t blocking = new_stream(sim, 0, stream_flags::blocking);
  stream_t non_blocking = new_stream(sim, 0, stream_flags::non_blocking);
  for (const bool is_blocking : {true, false}) {
    INFO((is_blocking ? "a blocking stream" : "a non-blocking stream"));
    stream_t s = is_blocking ? blocking : non_blocking;
    std::atomic<bool> first_done{false};
    std::atomic<bool> legacy_saw{false};
    std::atomic<bool> after_saw_legacy{false};
    std::atomic<bool> legacy_done{false};
    std::atomic<bool> release{false};
    REQUIRE(sim.launch_host_func(s, [&] {
      while (!release) std::this_thread::sleep_for(1ms);
      first_done = true;
    }) == error::success);
    // Work on the legacy stream: it waits for the blocking stream's work.
    REQUIRE(sim.launch_host_func(legacy(), [&] {
      legacy_saw = first_done.load();
      legacy_done = true;
    }) == error::success);
    // Later work on the blocking stream waits for the legacy stream.
    REQUIRE(sim.launch_host_func(s, [&] { after_saw_legacy = legacy_done.load(); }) ==
            error::success);
    if (!is_blocking) CHECK(testing::eventually([&] { return legacy_done.load(); }));
    std::this_thread::sleep_for(10ms);
    release = true;
    synchronize(sim, 0, s);
    synchronize(sim, 0, legacy());
    CHECK(legacy_saw == is_blocking);
    CHECK(after_saw_legacy);
  }
  REQUIRE(sim.stream_destroy(blocking) == error::success);
  REQUIRE(sim.stream_destroy(non_blocking) == error::success);
}

TEST_CASE("handle 2 is a stream of the calling thread and its current device",
          "[cuda][sim][rules]") {
  sim_api sim;
  REQUIRE(sim.set_device(0) == error::success);
  std::atomic<bool> release{false};
  REQUIRE(sim.launch_host_func(per_thread(), [&] {
    while (!release) std::this_thread::sleep_for(1ms);
  }) == error::success);
  // Another thread's stream 2 is another stream: not held by this one's.
  std::atomic<bool> other_ran{false};
  std::thread other([&] {
    REQUIRE(sim.set_device(0) == error::success);
    REQUIRE(sim.launch_host_func(per_thread(), [&] { other_ran = true; }) == error::success);
  });
  other.join();
  CHECK(testing::eventually([&] { return other_ran.load(); }));
  // This thread's stream 2 on cuda:1 is another stream too.
  std::atomic<bool> device1_ran{false};
  REQUIRE(sim.set_device(1) == error::success);
  REQUIRE(sim.launch_host_func(per_thread(), [&] { device1_ran = true; }) == error::success);
  CHECK(testing::eventually([&] { return device1_ran.load(); }));
  int device = -1;
  REQUIRE(sim.stream_get_device(per_thread(), &device) == error::success);
  CHECK(device == 1);
  release = true;
  synchronize(sim, 0, per_thread());
}

TEST_CASE("failing calls set the thread's last error, which cudaGetLastError returns and clears",
          "[cuda][sim][rules]") {
  sim_api sim;
  (void)sim.get_last_error();  // per thread: earlier tests on this thread may have set it
  CHECK(sim.get_last_error() == error::success);
  CHECK(sim.set_device(7) == error::invalid_device);
  CHECK(sim.peek_at_last_error() == error::invalid_device);
  // Another thread has its own.
  std::thread([&] { CHECK(sim.peek_at_last_error() == error::success); }).join();
  CHECK(sim.get_last_error() == error::invalid_device);
  CHECK(sim.get_last_error() == error::success);
  // "Not ready" is no error.
  stream_t s = new_stream(sim, 0);
  std::atomic<bool> release{false};
  REQUIRE(sim.launch_host_func(s, [&] {
    while (!release) std::this_thread::sleep_for(1ms);
  }) == error::success);
  event_t e = new_event(sim, 0);
  REQUIRE(sim.event_record(e, s) == error::success);
  CHECK(sim.event_query(e) == error::not_ready);
  CHECK(sim.peek_at_last_error() == error::success);
  release = true;
  synchronize(sim, 0, s);
  // A successful call leaves an earlier error in place (a kernel launched
  // with <<<>>> and checked with cudaGetLastError would report it).
  sim.fail_call("cudaMallocAsync", 1, error::memory_allocation);
  void* p = nullptr;
  CHECK(sim.malloc_async(&p, 64, s) == error::memory_allocation);
  REQUIRE(sim.malloc_async(&p, 64, s) == error::success);
  CHECK(sim.peek_at_last_error() == error::memory_allocation);
  CHECK(sim.get_last_error() == error::memory_allocation);
  // A failed context's error is never cleared.
  sim.make_sticky(error::illegal_address);
  CHECK(sim.get_last_error() == error::illegal_address);
  CHECK(sim.get_last_error() == error::illegal_address);
  sim.clear_faults();
  CHECK(sim.get_last_error() == error::success);
  REQUIRE(sim.free_async(p, s) == error::success);
  REQUIRE(sim.event_destroy(e) == error::success);
  REQUIRE(sim.stream_destroy(s) == error::success);
}

TEST_CASE("a kernel fault is sticky: the context is lost", "[cuda][sim][rules]") {
  sim_api sim;
  stream_t s = new_stream(sim, 0);
  void* out = nullptr;
  REQUIRE(sim.malloc_async(&out, 64, s) == error::success);
  REQUIRE(sim.launch_kernel(
              std::make_shared<test_kernel>(out, 64, nullptr, error::misaligned_address), s) ==
          error::success);
  CHECK(testing::eventually([&] { return sim.sticky_error() == error::misaligned_address; }));
  require_reports(sim, 1, {"rule: testKernel", "cudaErrorMisalignedAddress", "sticky"});
  void* more = nullptr;
  CHECK(sim.malloc_async(&more, 64, s) == error::misaligned_address);
  CHECK(sim.get_last_error() == error::misaligned_address);
  sim.clear_faults();
}

TEST_CASE("a kernel reading another device's memory needs peer access", "[cuda][sim][rules]") {
  sim_api sim;
  REQUIRE(sim.set_device(1) == error::success);
  void* on1 = nullptr;
  REQUIRE(sim.malloc_device(&on1, 64) == error::success);
  stream_t s0 = new_stream(sim, 0);
  void* out = nullptr;
  REQUIRE(sim.malloc_device(&out, 64) == error::success);
  REQUIRE(sim.launch_kernel(std::make_shared<test_kernel>(out, 64, on1), s0) == error::success);
  require_reports(sim, 1,
                  {"cudaErrorIllegalAddress", "device memory of cuda:1",
                   "without cudaDeviceEnablePeerAccess for cuda:0"});
  CHECK(testing::eventually([&] { return sim.sticky_error() == error::illegal_address; }));
  sim.clear_faults();
  sim_api fresh;
  REQUIRE(fresh.set_device(1) == error::success);
  REQUIRE(fresh.malloc_device(&on1, 64) == error::success);
  s0 = new_stream(fresh, 0);
  REQUIRE(fresh.malloc_device(&out, 64) == error::success);
  REQUIRE(fresh.device_enable_peer_access(1) == error::success);
  CHECK(fresh.device_enable_peer_access(1) == error::peer_access_already_enabled);
  CHECK(fresh.get_last_error() == error::peer_access_already_enabled);
  REQUIRE(fresh.launch_kernel(std::make_shared<test_kernel>(out, 64, on1), s0) == error::success);
  synchronize(fresh, 0, s0);
  CHECK(static_cast<char*>(out)[0] == 7);
  REQUIRE(fresh.free_device(out) == error::success);
  REQUIRE(fresh.free_device(on1) == error::success);
  REQUIRE(fresh.stream_destroy(s0) == error::success);
}

TEST_CASE("contexts open on cudaSetDevice and device work, not on device queries",
          "[cuda][sim][rules]") {
  sim_api sim(sim_options{.devices = 3});
  int count = 0;
  REQUIRE(sim.get_device_count(&count) == error::success);
  device_properties p;
  REQUIRE(sim.get_device_properties(&p, 2) == error::success);
  int can = 0;
  REQUIRE(sim.device_can_access_peer(&can, 0, 2) == error::success);
  CHECK(sim.contexts().empty());
  REQUIRE(sim.set_device(2) == error::success);
  CHECK(sim.contexts() == std::vector<int>{2});
}

TEST_CASE("copies and kernels take at least the minimum duration", "[cuda][sim][rules]") {
  sim_options so;
  so.min_op_us = 30000;
  sim_api sim(so);
  stream_t s = new_stream(sim, 0);
  void* a = nullptr;
  void* b = nullptr;
  REQUIRE(sim.malloc_device(&a, 64) == error::success);
  REQUIRE(sim.malloc_device(&b, 64) == error::success);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(sim.memcpy_async(b, a, 64, memcpy_kind::device_to_device, s) == error::success);
  synchronize(sim, 0, s);
  CHECK(std::chrono::steady_clock::now() - start >= 30ms);
  REQUIRE(sim.free_device(a) == error::success);
  REQUIRE(sim.free_device(b) == error::success);
  REQUIRE(sim.stream_destroy(s) == error::success);
}

}  // namespace dlasync::cuda
