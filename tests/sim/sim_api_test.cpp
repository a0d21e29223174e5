#include "runtime/sim/sim_api.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "support/runtime_fixture.hpp"
#include "support/sim_reports.hpp"
#include "support/test_tensors.hpp"

namespace dlasync::cuda {
namespace {

using namespace std::chrono_literals;

stream_t new_stream(sim_api& sim, int device = 0) {
  REQUIRE(sim.set_device(device) == error::success);
  stream_t s = nullptr;
  REQUIRE(sim.stream_create(&s, stream_flags::non_blocking) == error::success);
  return s;
}

}  // namespace

TEST_CASE("simulated streams run their work in order", "[cuda][sim]") {
  sim_api sim;
  stream_t s = new_stream(sim);
  std::vector<int> order;
  std::mutex m;
  for (int i = 0; i < 50; ++i) {
    REQUIRE(sim.launch_host_func(s, [&, i] {
      if (i % 7 == 0) std::this_thread::sleep_for(1ms);
      std::lock_guard lock(m);
      order.push_back(i);
    }) == error::success);
  }
  event_t e = nullptr;
  REQUIRE(sim.event_create(&e) == error::success);
  REQUIRE(sim.event_record(e, s) == error::success);
  CHECK(testing::eventually([&] { return sim.event_query(e) == error::success; }));
  std::vector<int> want(50);
  for (int i = 0; i < 50; ++i) want[i] = i;
  CHECK(order == want);
  CHECK(sim.event_destroy(e) == error::success);
  CHECK(sim.stream_destroy(s) == error::success);
}

TEST_CASE("an event is not ready until its stream reaches it", "[cuda][sim]") {
  sim_api sim;
  stream_t s = new_stream(sim);
  std::atomic<bool> release{false};
  sim.launch_host_func(s, [&] {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  event_t e = nullptr;
  sim.event_create(&e);
  sim.event_record(e, s);
  std::this_thread::sleep_for(10ms);
  CHECK(sim.event_query(e) == error::not_ready);
  release = true;
  CHECK(testing::eventually([&] { return sim.event_query(e) == error::success; }));
  sim.event_destroy(e);
  sim.stream_destroy(s);
}

TEST_CASE("a stream waits for another stream's event, across devices", "[cuda][sim]") {
  sim_api sim;
  stream_t producer = new_stream(sim, 0);
  stream_t consumer = new_stream(sim, 1);
  std::atomic<int> step{0};
  sim.launch_host_func(producer, [&] {
    std::this_thread::sleep_for(20ms);
    step = 1;
  });
  event_t e = nullptr;
  REQUIRE(sim.set_device(0) == error::success);  // an event of the producer's device
  REQUIRE(sim.event_create(&e) == error::success);
  REQUIRE(sim.event_record(e, producer) == error::success);
  REQUIRE(sim.set_device(1) == error::success);
  REQUIRE(sim.stream_wait_event(consumer, e) == error::success);
  int seen = -1;
  sim.launch_host_func(consumer, [&] { seen = step.load(); });
  event_t done = nullptr;
  sim.event_create(&done);
  sim.event_record(done, consumer);
  CHECK(testing::eventually([&] { return sim.event_query(done) == error::success; }));
  CHECK(seen == 1);
  sim.event_destroy(e);
  sim.event_destroy(done);
  sim.stream_destroy(producer);
  sim.stream_destroy(consumer);
}

TEST_CASE("a wait holds for the record it saw, not for a later record of the event",
          "[cuda][sim]") {
  // Events are recycled as soon as a wait is enqueued: recording the event
  // again on an idle stream must not release the wait early.
  sim_api sim;
  stream_t busy = new_stream(sim);
  stream_t idle = new_stream(sim);
  stream_t waiter = new_stream(sim);
  std::atomic<bool> release{false};
  std::atomic<bool> released_seen{false};
  sim.launch_host_func(busy, [&] {
    while (!release) std::this_thread::sleep_for(1ms);
  });
  event_t e = nullptr;
  sim.event_create(&e);
  sim.event_record(e, busy);
  sim.stream_wait_event(waiter, e);
  sim.launch_host_func(waiter, [&] { released_seen = release.load(); });
  event_t waited = nullptr;
  sim.event_create(&waited);
  sim.event_record(waited, waiter);
  sim.event_record(e, idle);  // a later record, on a stream with nothing to do
  CHECK(testing::eventually([&] { return sim.event_query(e) == error::success; }));
  std::this_thread::sleep_for(10ms);
  CHECK(sim.event_query(waited) == error::not_ready);
  release = true;
  CHECK(testing::eventually([&] { return sim.event_query(waited) == error::success; }));
  CHECK(released_seen);
  sim.event_destroy(e);
  sim.event_destroy(waited);
  sim.stream_destroy(busy);
  sim.stream_destroy(idle);
  sim.stream_destroy(waiter);
}

TEST_CASE("pageable copies hold the caller, pinned copies do not", "[cuda][sim]") {
  sim_api sim;
  stream_t s = new_stream(sim);
  void* device = nullptr;
  REQUIRE(sim.malloc_async(&device, 64, s) == error::success);
  std::vector<char> pageable(64, 'p');
  void* pinned = nullptr;
  REQUIRE(sim.malloc_host(&pinned, 64) == error::success);
  std::memset(pinned, 'q', 64);

  std::atomic<bool> gate_passed{false};
  auto gate = [&] {
    std::this_thread::sleep_for(20ms);
    gate_passed = true;
  };
  sim.launch_host_func(s, gate);
  REQUIRE(sim.memcpy_async(device, pageable.data(), 64, memcpy_kind::host_to_device, s) ==
          error::success);
  CHECK(gate_passed);  // held until the stream got there

  gate_passed = false;
  sim.launch_host_func(s, gate);
  REQUIRE(sim.memcpy_async(device, pinned, 64, memcpy_kind::host_to_device, s) == error::success);
  CHECK_FALSE(gate_passed);  // returned at once
  event_t e = nullptr;
  sim.event_create(&e);
  sim.event_record(e, s);
  CHECK(testing::eventually([&] { return sim.event_query(e) == error::success; }));
  CHECK(static_cast<char*>(device)[63] == 'q');
  const sim_stats st = sim.stats();
  CHECK(st.pageable_copies == 1);
  CHECK(st.async_copies == 1);
  CHECK(sim.memcpy_async(device, pinned, 64, memcpy_kind::device_to_host, s) ==
        error::invalid_value);  // the kind contradicts the pointers
  testing::require_reports(sim, 1,
                           {"rule: cudaMemcpyAsync", "cudaErrorInvalidValue",
                            "the kind says device to host", "host to device"});
  CHECK(sim.get_last_error() == error::invalid_value);
  CHECK(sim.get_last_error() == error::success);
  sim.free_async(device, s);
  sim.free_host(pinned);
  sim.event_destroy(e);
  sim.stream_destroy(s);
}

TEST_CASE("device memory has a capacity and is freed in stream order", "[cuda][sim]") {
  sim_options o;
  o.memory_per_device = 1000;
  sim_api sim(o);
  stream_t s = new_stream(sim);
  void* a = nullptr;
  void* b = nullptr;
  REQUIRE(sim.malloc_async(&a, 600, s) == error::success);
  CHECK(sim.malloc_async(&b, 600, s) == error::memory_allocation);
  CHECK(sim.device_bytes_in_use(0) == 600);
  pointer_attributes attr;
  REQUIRE(sim.pointer_get_attributes(&attr, static_cast<char*>(a) + 10) == error::success);
  CHECK(attr.type == memory_type::device);
  CHECK(attr.device == 0);
  int local = 0;
  sim.pointer_get_attributes(&attr, &local);
  CHECK(attr.type == memory_type::unregistered);
  sim.free_async(a, s);
  CHECK(testing::eventually([&] { return sim.device_bytes_in_use(0) == 0; }));
  REQUIRE(sim.malloc_async(&b, 600, s) == error::success);
  sim.free_async(b, s);
  sim.stream_destroy(s);
}

TEST_CASE("device memory kept for reuse comes back for the same size, within its bound",
          "[cuda][sim]") {
  sim_options o;
  o.memory_per_device = 10000;
  o.device_reuse_bytes = 1024;
  sim_api sim(o);
  stream_t s = new_stream(sim);
  void* a = nullptr;
  void* big = nullptr;
  REQUIRE(sim.malloc_async(&a, 1000, s) == error::success);
  REQUIRE(sim.malloc_async(&big, 2000, s) == error::success);
  sim.free_async(a, s);
  sim.free_async(big, s);  // more than the bound: freed for good
  CHECK(testing::eventually([&] { return sim.device_bytes_in_use(0) == 0; }));
  void* again = nullptr;
  REQUIRE(sim.malloc_async(&again, 1000, s) == error::success);
  CHECK(again == a);
  CHECK(sim.device_bytes_in_use(0) == 1000);
  pointer_attributes attr;
  REQUIRE(sim.pointer_get_attributes(&attr, again) == error::success);
  CHECK(attr.type == memory_type::device);
  void* other = nullptr;  // another size: fresh memory
  REQUIRE(sim.malloc_async(&other, 512, s) == error::success);
  CHECK(other != a);
  sim.free_async(again, s);
  sim.free_async(other, s);
  CHECK(testing::eventually([&] { return sim.device_bytes_in_use(0) == 0; }));
  sim.stream_destroy(s);
}

TEST_CASE("injected failures hit the chosen call, sticky errors hit everything", "[cuda][sim]") {
  sim_api sim;
  stream_t s = new_stream(sim);
  sim.fail_call("cudaEventCreateWithFlags", 2, error::launch_failure);
  event_t e = nullptr;
  CHECK(sim.event_create(&e) == error::success);
  CHECK(sim.event_create(&e) == error::launch_failure);
  CHECK(sim.event_create(&e) == error::success);
  sim.fail_nth_call(1, error::unknown);
  int n = 0;
  CHECK(sim.get_device_count(&n) == error::unknown);
  CHECK(sim.get_device_count(&n) == error::success);
  sim.make_sticky(error::illegal_address);
  CHECK(sim.event_query(e) == error::illegal_address);
  CHECK(sim.get_device_count(&n) == error::illegal_address);
  sim.clear_faults();
  CHECK(sim.get_device_count(&n) == error::success);
  CHECK(n == 2);
  sim.stream_destroy(s);
}

// A kernel that fills its output with a byte, as a device kernel would.
struct fill_kernel final : device_kernel {
  fill_kernel(void* out, std::size_t n, unsigned char v) : out_(out), n_(n), v_(v) {}
  const char* name() const noexcept override { return "fillKernel"; }
  void* output() const noexcept override { return out_; }
  std::uint64_t output_bytes() const noexcept override { return n_; }
  error launch(stream_t) const override { return error::unknown; }  // never on a simulation
  std::vector<memory_range> inputs() const override { return {}; }
  error simulate() const override {
    std::memset(out_, v_, n_);
    return error::success;
  }
  void* out_;
  std::size_t n_;
  unsigned char v_;
};

TEST_CASE("simulated kernels run in stream order, on memory of the stream's device",
          "[cuda][sim]") {
  sim_api sim;
  stream_t s = new_stream(sim);
  void* out = nullptr;
  REQUIRE(sim.malloc_async(&out, 64, s) == error::success);
  std::atomic<bool> release{false};
  REQUIRE(sim.launch_host_func(s, [&] {
    while (!release) std::this_thread::sleep_for(1ms);
  }) == error::success);
  REQUIRE(sim.launch_kernel(std::make_shared<fill_kernel>(out, 64, 0x5a), s) == error::success);
  std::this_thread::sleep_for(5ms);
  CHECK(static_cast<unsigned char*>(out)[63] != 0x5a);  // behind the host function
  release = true;
  event_t e = nullptr;
  sim.event_create(&e);
  sim.event_record(e, s);
  CHECK(testing::eventually([&] { return sim.event_query(e) == error::success; }));
  CHECK(static_cast<unsigned char*>(out)[0] == 0x5a);
  CHECK(static_cast<unsigned char*>(out)[63] == 0x5a);
  // Output in host memory, or on another GPU, is refused.
  unsigned char host[4] = {};
  CHECK(sim.launch_kernel(std::make_shared<fill_kernel>(host, 4, 1), s) == error::invalid_value);
  testing::require_reports(sim, 1, {"fillKernel", "is not live device memory of cuda:0"});
  stream_t other = new_stream(sim, 1);
  CHECK(sim.launch_kernel(std::make_shared<fill_kernel>(out, 4, 1), other) == error::invalid_value);
  testing::require_reports(sim, 1, {"fillKernel", "is not live device memory of cuda:1"});
  REQUIRE(sim.set_device(0) == error::success);
  // A planned failure names the kernel like any call.
  sim.fail_call("fillKernel", 1, error::launch_failure);
  CHECK(sim.launch_kernel(std::make_shared<fill_kernel>(out, 4, 1), s) == error::launch_failure);
  sim.free_async(out, s);
  sim.event_destroy(e);
  sim.stream_destroy(s);
  sim.stream_destroy(other);
}

TEST_CASE("CUDA modes select the simulation, nothing, or the real runtime", "[cuda][sim]") {
  absl::StatusOr<std::unique_ptr<api>> sim = make_api("sim:3", {});
  REQUIRE(sim.ok());
  REQUIRE(*sim != nullptr);
  CHECK((*sim)->simulated());
  int n = 0;
  (*sim)->get_device_count(&n);
  CHECK(n == 3);
  absl::StatusOr<std::unique_ptr<api>> off = make_api("off", {});
  REQUIRE(off.ok());
  CHECK(*off == nullptr);
  testing::require_status(make_api("sim:zero", {}).status(), absl::StatusCode::kInvalidArgument,
                          {"sim:zero", "sim:2"});
  testing::require_status(make_api("gpu please", {}).status(), absl::StatusCode::kInvalidArgument,
                          {"off, auto, real, sim"});
  absl::StatusOr<std::unique_ptr<api>> real = make_api("real", {});
  if (!real.ok()) {
    testing::require_status(real.status(), absl::StatusCode::kUnavailable, {"sim:N"});
  }
  CHECK(to_status(error::memory_allocation, "cudaMallocAsync", 1).ToString() ==
        "RESOURCE_EXHAUSTED: cudaMallocAsync failed on cuda:1: cudaErrorMemoryAllocation (2)");
}

}  // namespace dlasync::cuda
