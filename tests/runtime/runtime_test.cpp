#include "dlasync/runtime.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/src/runtime_core.hpp"
#include "support/runtime_fixture.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {

using testing::require_status;

TEST_CASE("a runtime serves the host devices it was given", "[runtime][runtime]") {
  std::unique_ptr<runtime> rt = testing::make_runtime(3);
  CHECK(rt->registry().addressable_list() == "cpu:0, cpu:1, cpu:2, cuda_host:0");
  CHECK(rt->accepting());
  CHECK(rt->in_flight() == 0);
  CHECK(rt->options().host_devices == 3);
  CHECK(rt->describe(host_device) == "host memory");
  CHECK(rt->describe({device_kind::cuda, 0}) == "unknown");
  CHECK_FALSE(rt->is_simulated(host_device));
  detail::runtime_core& core = detail::core_of(*rt);
  CHECK(std::string(core.host().name()) == "host");
  const stream_slot a = core.next_stream({device_kind::cpu, 1});
  const stream_slot b = core.next_stream({device_kind::cpu, 1});
  CHECK(a.index != b.index);  // two streams a device, taken in turn
}

TEST_CASE("several runtimes live side by side and shut down twice safely", "[runtime][runtime]") {
  std::unique_ptr<runtime> a = testing::make_runtime();
  std::unique_ptr<runtime> b = testing::make_runtime();
  a->shutdown();
  CHECK_FALSE(a->accepting());
  CHECK(b->accepting());
  a->shutdown();
  CHECK(detail::core_of(*a).begin_operation([] {}) == 0);
  const std::uint64_t op = detail::core_of(*b).begin_operation([] {});
  CHECK(op != 0);
  detail::core_of(*b).end_operation(op);
}

TEST_CASE("a host stream runs its tasks one at a time, in the order enqueued",
          "[runtime][backend]") {
  std::unique_ptr<runtime> rt = testing::make_runtime();
  detail::host_backend& host = detail::core_of(*rt).host();
  const stream_slot s{host_device, 0};
  constexpr int tasks = 200;
  // Task i must start after task i - 1 said it was done, and not before.
  std::atomic<int> last_done{-1};
  std::atomic<int> early{0};
  std::mutex mutex;
  std::vector<int> order;
  std::vector<std::thread> finishers;
  for (int i = 0; i < tasks; ++i) {
    host.stream(s).enqueue([&, i](detail::host_stream::done_fn done) mutable {
      if (last_done.load() != i - 1) ++early;
      auto finish = [&last_done, i, done = std::move(done)]() mutable {
        last_done.store(i);
        std::move(done)();
      };
      std::unique_lock lock(mutex);
      order.push_back(i);
      if (i % 3 == 0) {
        // Done from another thread, later: the next task must wait for it.
        finishers.emplace_back([finish = std::move(finish)]() mutable {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          std::move(finish)();
        });
        return;
      }
      lock.unlock();
      std::move(finish)();
    });
  }
  marker_ptr all = host.record(s);
  CHECK(testing::eventually([&] { return all->done(); }));
  std::vector<int> want(tasks);
  for (int i = 0; i < tasks; ++i) want[i] = i;
  {
    std::lock_guard lock(mutex);
    CHECK(order == want);
  }
  CHECK(early == 0);
  for (std::thread& t : finishers) t.join();
}

TEST_CASE("a host stream holds the next task until the running one is done", "[runtime][backend]") {
  std::unique_ptr<runtime> rt = testing::make_runtime();
  detail::host_backend& host = detail::core_of(*rt).host();
  const stream_slot s{host_device, 1};
  detail::host_stream::done_fn held;
  std::mutex mutex;
  host.stream(s).enqueue([&](detail::host_stream::done_fn done) {
    std::lock_guard lock(mutex);
    held = std::move(done);
  });
  marker_ptr after = host.record(s);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(after->done());
  {
    std::lock_guard lock(mutex);
    REQUIRE(held);
    std::move(held)();
  }
  CHECK(testing::eventually([&] { return after->done(); }));
}

TEST_CASE("freed large host buffers are reused within their size class, unless caching is off",
          "[runtime][backend]") {
  std::unique_ptr<runtime> rt = testing::make_runtime();
  detail::host_backend& host = detail::core_of(*rt).host();
  void* first = nullptr;
  {
    absl::StatusOr<device_buffer> b = host.allocate(host_device, 3 << 20, 64, {host_device, 0});
    REQUIRE(b.ok());
    first = b->data();
  }
  CHECK(host.cached_bytes() >= (3 << 20));
  absl::StatusOr<device_buffer> again =
      host.allocate(host_device, (3 << 20) - 100, 64, {host_device, 0});
  REQUIRE(again.ok());
  CHECK(again->data() == first);  // same size class: the cached block
  CHECK(host.cached_bytes() == 0);
  absl::StatusOr<device_buffer> other = host.allocate(host_device, 3 << 20, 64, {host_device, 0});
  REQUIRE(other.ok());
  CHECK(other->data() != first);

  runtime_options o;
  o.topology = process_topology::single_process();
  o.worker_threads = 1;
  o.host_cache_bytes = 0;
  std::unique_ptr<runtime> uncached = *runtime::create(o);
  detail::host_backend& plain = detail::core_of(*uncached).host();
  {
    absl::StatusOr<device_buffer> kept = plain.allocate(host_device, 1 << 20, 64, {host_device, 0});
    REQUIRE(kept.ok());
    CHECK(reinterpret_cast<std::uintptr_t>(kept->data()) % 64 == 0);
  }
  CHECK(plain.cached_bytes() == 0);  // given back to the system at once
}

TEST_CASE("freed small host buffers are reused too", "[runtime][backend]") {
  // A small copy's buffer (4 KiB up) comes from the cache as a large one
  // does: aligned_alloc and free cost more than the copy at that size.
  std::unique_ptr<runtime> rt = testing::make_runtime();
  detail::host_backend& host = detail::core_of(*rt).host();
  for (const auto& [bytes, then] : {std::pair<std::uint64_t, std::uint64_t>{4096, 4096},
                                    std::pair<std::uint64_t, std::uint64_t>{6000, 5800}}) {
    const std::uint64_t before = host.cached_bytes();
    void* first = nullptr;
    {
      absl::StatusOr<device_buffer> b = host.allocate(host_device, bytes, 64, {host_device, 0});
      REQUIRE(b.ok());
      first = b->data();
    }
    CHECK(host.cached_bytes() >= before + bytes);
    absl::StatusOr<device_buffer> again = host.allocate(host_device, then, 64, {host_device, 0});
    REQUIRE(again.ok());
    CHECK(again->data() == first);  // the same size class
    CHECK(host.cached_bytes() == before);
  }
  // Below a page, blocks are not cached: a tiny tensor holds no page.
  const std::uint64_t before = host.cached_bytes();
  { absl::StatusOr<device_buffer> tiny = host.allocate(host_device, 100, 64, {host_device, 0}); }
  CHECK(host.cached_bytes() == before);
}

TEST_CASE("host allocations are aligned and refuse the impossible", "[runtime][backend]") {
  std::unique_ptr<runtime> rt = testing::make_runtime();
  detail::host_backend& host = detail::core_of(*rt).host();
  absl::StatusOr<device_buffer> b = host.allocate(host_device, 1000, 256, {host_device, 0});
  REQUIRE(b.ok());
  CHECK(reinterpret_cast<std::uintptr_t>(b->data()) % 256 == 0);
  CHECK(b->bytes() == 1000);
  require_status(host.allocate(host_device, ~std::uint64_t{0} - 8, 64, {host_device, 0}).status(),
                 absl::StatusCode::kResourceExhausted, {"cannot allocate", "cpu:0"});
}

TEST_CASE("callers allocate host memory, and GPU and pinned memory where a GPU is",
          "[runtime][allocate]") {
  std::unique_ptr<runtime> rt = testing::make_runtime();
  {
    absl::StatusOr<device_buffer> b = rt->allocate({device_kind::cpu, 1}, 4096);
    REQUIRE(b.ok());
    CHECK(b->device() == device{device_kind::cpu, 1});
    std::memset(b->data(), 7, 4096);
  }
  require_status(rt->allocate({device_kind::cpu, 7}, 64).status(), absl::StatusCode::kNotFound,
                 {"allocation device cpu:7"});
  require_status(rt->allocate({device_kind::cuda_host, 0}, 64).status(),
                 absl::StatusCode::kUnimplemented, {"page-locked", "CUDA"});
  require_status(rt->allocate({device_kind::cuda, 0}, 64).status(),
                 absl::StatusCode::kUnimplemented, {"cuda:0", "not served"});

  testing::sim_runtime r = testing::make_sim_runtime();
  CHECK(r.rt->describe({device_kind::cuda, 1}) == "dlasync simulated GPU 1");
  CHECK(r.rt->describe({device_kind::cuda_host, 0}) == "page-locked host memory");
  CHECK(r.rt->is_simulated({device_kind::cuda, 0}));
  CHECK_FALSE(r.rt->is_simulated(host_device));
  {
    absl::StatusOr<device_buffer> gpu = r.rt->allocate({device_kind::cuda, 1}, 1 << 20);
    REQUIRE(gpu.ok());
    CHECK(r.sim->device_bytes_in_use(1) == 1 << 20);
    absl::StatusOr<device_buffer> pinned = r.rt->allocate({device_kind::cuda_host, 0}, 4096);
    REQUIRE(pinned.ok());
    CHECK(r.sim->host_bytes_pinned() == 4096);
  }
  CHECK(r.sim->device_bytes_in_use(1) == 0);
  CHECK(r.sim->host_bytes_pinned() == 0);
  require_status(r.rt->allocate({device_kind::cuda_managed, 0}, 64).status(),
                 absl::StatusCode::kUnimplemented, {"cuda_managed:0"});
  r.sim->fail_call("cudaMalloc", 1, cuda::error::memory_allocation);
  require_status(r.rt->allocate({device_kind::cuda, 0}, 64).status(),
                 absl::StatusCode::kResourceExhausted, {"cudaMalloc", "cuda:0"});
}

}  // namespace dlasync
