#include "dlasync/runtime/runtime.hpp"

#include "catch2/catch.hpp"
#include "support/runtime_fixture.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {

using testing::require_status;

TEST_CASE("bad runtime options are refused naming the option", "[runtime][runtime]") {
  runtime_options o;
  o.topology = process_topology::single_process();
  o.executor_threads = 0;
  require_status(runtime::create(o).status(), absl::StatusCode::kInvalidArgument,
                 {"executor_threads is 0", "[1, 1024]"});
  o.executor_threads = 1;
  o.streams_per_device = 0;
  require_status(runtime::create(o).status(), absl::StatusCode::kInvalidArgument,
                 {"streams_per_device"});
  o.streams_per_device = 2;
  o.topology->rank = 3;
  require_status(runtime::create(o).status(), absl::StatusCode::kInvalidArgument, {"rank 3"});
}

TEST_CASE("a runtime serves the host devices it was given", "[runtime][runtime]") {
  std::unique_ptr<runtime> rt = testing::make_runtime(3);
  CHECK(rt->registry().addressable_list() == "cpu:0, cpu:1, cpu:2, cuda_host:0");
  CHECK(rt->accepting());
  CHECK(rt->in_flight() == 0);
  CHECK(std::string(rt->backend_for(host_device).name()) == "host");
  const stream_ref a = rt->next_stream({device_kind::cpu, 1});
  const stream_ref b = rt->next_stream({device_kind::cpu, 1});
  CHECK(a.index != b.index);  // two streams a device, taken in turn
}

TEST_CASE("several runtimes live side by side and shut down twice safely", "[runtime][runtime]") {
  std::unique_ptr<runtime> a = testing::make_runtime();
  std::unique_ptr<runtime> b = testing::make_runtime();
  a->shutdown();
  CHECK_FALSE(a->accepting());
  CHECK(b->accepting());
  a->shutdown();
  CHECK(a->begin_operation([] {}) == 0);
}

TEST_CASE("the host backend runs a stream's work in order", "[runtime][backend]") {
  std::unique_ptr<runtime> rt = testing::make_runtime();
  backend& host = rt->backend_for(host_device);
  const stream_ref s{host_device, 0};
  std::vector<std::int32_t> src(1 << 20, 7);
  std::vector<std::int32_t> dst(src.size(), 0);
  copy_job job;
  job.source_device = host_device;
  job.source = src.data();
  job.destination = dst.data();
  job.layout = {4, {static_cast<std::int64_t>(src.size())}, {1}};
  marker_ptr m = host.enqueue_copy(s, std::move(job));
  std::atomic<bool> seen{false};
  m->on_complete([&](absl::Status status) {
    CHECK(status.ok());
    CHECK(dst.back() == 7);  // the copy before the marker is done
    seen = true;
  });
  CHECK(testing::eventually([&] { return seen.load(); }));
}

TEST_CASE("a stream waits for another stream's marker", "[runtime][backend]") {
  std::unique_ptr<runtime> rt = testing::make_runtime();
  backend& host = rt->backend_for(host_device);
  auto gate = std::make_shared<completion_marker>();
  const stream_ref s{host_device, 1};
  CHECK(host.wait(s, gate).ok());
  marker_ptr after = host.record(s);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(after->done());
  gate->complete(absl::OkStatus());
  CHECK(testing::eventually([&] { return after->done(); }));
}

TEST_CASE("freed large host buffers are reused within their size class", "[runtime][backend]") {
  std::unique_ptr<runtime> rt = testing::make_runtime();
  backend& host = rt->backend_for(host_device);
  void* first = nullptr;
  {
    absl::StatusOr<device_buffer> b = host.allocate(host_device, 3 << 20, 64, {host_device, 0});
    REQUIRE(b.ok());
    first = b->data();
  }
  absl::StatusOr<device_buffer> again =
      host.allocate(host_device, (3 << 20) - 100, 64, {host_device, 0});
  REQUIRE(again.ok());
  CHECK(again->data() == first);  // same size class: the cached block
  absl::StatusOr<device_buffer> other = host.allocate(host_device, 3 << 20, 64, {host_device, 0});
  REQUIRE(other.ok());
  CHECK(other->data() != first);

  runtime_options o;
  o.topology = process_topology::single_process();
  o.worker_threads = 1;
  o.host_cache_bytes = 0;
  std::unique_ptr<runtime> uncached = *runtime::create(o);
  backend& plain = uncached->backend_for(host_device);
  absl::StatusOr<device_buffer> kept = plain.allocate(host_device, 1 << 20, 64, {host_device, 0});
  REQUIRE(kept.ok());
  CHECK(reinterpret_cast<std::uintptr_t>(kept->data()) % 64 == 0);
}

TEST_CASE("host allocations are aligned and refuse the impossible", "[runtime][backend]") {
  std::unique_ptr<runtime> rt = testing::make_runtime();
  backend& host = rt->backend_for(host_device);
  absl::StatusOr<device_buffer> b = host.allocate(host_device, 1000, 256, {host_device, 0});
  REQUIRE(b.ok());
  CHECK(reinterpret_cast<std::uintptr_t>(b->data()) % 256 == 0);
  CHECK(b->bytes() == 1000);
  require_status(host.allocate(host_device, ~std::uint64_t{0} - 8, 64, {host_device, 0}).status(),
                 absl::StatusCode::kResourceExhausted, {"cannot allocate", "cpu:0"});
}

}  // namespace dlasync
