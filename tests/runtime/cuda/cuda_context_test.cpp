// The CUDA context on simulated GPUs, built alone (no runtime): its streams
// for the GPUs it serves, markers recorded on streams, device-side waits
// between streams, drains, memory whose free failed, the producer's and
// the consumer's streams, and what device a pointer's memory is on.
#include "runtime/src/cuda/cuda_context.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "catch2/catch.hpp"
#include "dlasync/dlpack_stream.hpp"
#include "runtime/sim/sim_api.hpp"
#include "runtime/src/cuda/device_guard.hpp"
#include "runtime/src/work_pool.hpp"
#include "support/test_tensors.hpp"

namespace dlasync::detail {
namespace {

using namespace std::chrono_literals;
using testing::require_status;

cuda::sim_options checked() {
  cuda::sim_options so;
  so.check_order = true;
  so.on_report = cuda::report_action::collect;
  return so;
}

std::shared_ptr<cuda_context> make_context(const std::shared_ptr<cuda::sim_api>& sim,
                                           const std::vector<bool>& served = {true, true},
                                           const cuda_options& options = {}) {
  absl::StatusOr<std::shared_ptr<cuda_context>> c = cuda_context::create(sim, options, served);
  INFO("status: " << c.status().ToString());
  REQUIRE(c.ok());
  return *std::move(c);
}

// Holds `s` (of `device`) with a host function until the returned promise
// is set.
std::promise<void> gate(cuda::api& api, int device, cuda::stream_t s) {
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  absl::StatusOr<device_guard> on = device_guard::enter(api, device);
  REQUIRE(on.ok());
  REQUIRE(api.launch_host_func(s, [opened] { opened.wait(); }) == cuda::error::success);
  return open;
}

// Waits (30 s at most: a hang guard) for `m` and returns its status.
absl::Status wait(const marker_ptr& m) {
  auto got = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> f = got->get_future();
  m->on_complete([got](absl::Status s) { got->set_value(std::move(s)); });
  REQUIRE(f.wait_for(30s) == std::future_status::ready);
  return f.get();
}

}  // namespace

TEST_CASE("a context creates streams only for the GPUs it serves", "[runtime][cuda][context]") {
  auto sim = std::make_shared<cuda::sim_api>(checked());
  cuda_options o;
  o.streams_per_device = 3;
  o.staging_streams = 2;
  o.staging_chunk_bytes = 8192;
  o.staging_chunks = 5;
  std::shared_ptr<cuda_context> c = make_context(sim, {false, true}, o);
  CHECK(c->device_count() == 2);
  CHECK(sim->contexts() == std::vector<int>{1});  // GPU 0 untouched
  CHECK(c->staging(1).size() == 2);
  CHECK(c->stream(1, 0) != c->stream(1, 1));
  CHECK(c->stream(1, 3) == c->stream(1, 0));  // index modulo the count
  CHECK(c->chunks().chunk_bytes() == 8192);
  CHECK(c->chunks().chunk_count() == 5);
  CHECK(&c->api() == sim.get());
}

TEST_CASE("a marker completes when its stream gets there, its callbacks where the options say",
          "[runtime][cuda][context]") {
  auto sim = std::make_shared<cuda::sim_api>(checked());
  SECTION("on the reactor thread without a hand-off") {
    std::shared_ptr<cuda_context> c = make_context(sim);
    cuda::stream_t s = c->stream(1, 0);
    std::promise<void> open = gate(*sim, 1, s);
    marker_ptr m = c->record(1, s);
    std::atomic<bool> on_reactor{false};
    m->on_complete([&](const absl::Status&) { on_reactor = c->on_reactor_thread(); });
    c->quiesce();
    CHECK_FALSE(m->done());
    CHECK(failed_at_once(m).ok());
    open.set_value();
    CHECK(wait(m).ok());
    c->quiesce();
    CHECK(on_reactor);
  }
  SECTION("on the workers of the hand-off") {
    work_pool pool(1, 0ns);
    auto completions = std::make_shared<handoff>();
    completions->attach(pool);
    cuda_options o;
    o.completions = completions;
    std::shared_ptr<cuda_context> c = make_context(sim, {true, true}, o);
    std::atomic<bool> on_worker{false};
    // The stream is held until the callback is registered: a marker done
    // already runs a new callback at once, on this thread.
    cuda::stream_t s = c->stream(0, 1);
    std::promise<void> open = gate(*sim, 0, s);
    marker_ptr m = c->record(0, s);
    m->on_complete([&](const absl::Status&) { on_worker = pool.running_in_this_thread(); });
    open.set_value();
    CHECK(wait(m).ok());
    c->quiesce();
    completions->detach();
    pool.drain();
    CHECK(on_worker);
  }
}

TEST_CASE("a marker that cannot be recorded is returned completed with the error",
          "[runtime][cuda][context]") {
  auto sim = std::make_shared<cuda::sim_api>(checked());
  std::shared_ptr<cuda_context> c = make_context(sim);
  sim->fail_call("cudaEventRecord", 1, cuda::error::launch_failure);
  marker_ptr m = c->record(0, c->stream(0, 0));
  CHECK(m->done());
  require_status(failed_at_once(m), absl::StatusCode::kInternal,
                 {"cudaEventRecord", "cuda:0", "cudaErrorLaunchFailure"});
  // The event went back: the next record works.
  CHECK(wait(c->record(0, c->stream(0, 0))).ok());
}

TEST_CASE("a stream waits on the device for a pending marker and for another GPU's stream",
          "[runtime][cuda][context]") {
  auto sim = std::make_shared<cuda::sim_api>(checked());
  std::shared_ptr<cuda_context> c = make_context(sim);
  cuda::stream_t first = c->stream(0, 0);
  cuda::stream_t second = c->stream(0, 1);
  cuda::stream_t across = c->stream(1, 0);
  // `first` is held by a gate, then bumps a count; the marker and the
  // cross-GPU wait come after the bump.
  std::promise<void> open = gate(*sim, 0, first);
  std::atomic<int> bumped{0};
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*sim, 0);
    REQUIRE(on.ok());
    REQUIRE(sim->launch_host_func(first, [&] { ++bumped; }) == cuda::error::success);
  }
  marker_ptr m = c->record(0, first);
  absl::Status status;
  REQUIRE(c->wait_for(0, second, m.get(), status));
  REQUIRE(status.ok());
  REQUIRE(c->order_after(1, across, 0, first).ok());
  std::atomic<int> second_saw{-1};
  std::atomic<int> across_saw{-1};
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*sim, 0);
    REQUIRE(on.ok());
    REQUIRE(sim->launch_host_func(second, [&] { second_saw = bumped.load(); }) ==
            cuda::error::success);
  }
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*sim, 1);
    REQUIRE(on.ok());
    REQUIRE(sim->launch_host_func(across, [&] { across_saw = bumped.load(); }) ==
            cuda::error::success);
  }
  marker_ptr second_done = c->record(0, second);
  marker_ptr across_done = c->record(1, across);
  c->quiesce();
  CHECK_FALSE(second_done->done());
  CHECK_FALSE(across_done->done());
  open.set_value();
  CHECK(wait(second_done).ok());
  CHECK(wait(across_done).ok());
  CHECK(second_saw == 1);
  CHECK(across_saw == 1);
  CHECK(wait(m).ok());
  c->quiesce();
  // A marker that completed is no longer one to wait for.
  CHECK_FALSE(c->wait_for(0, second, m.get(), status));
}

TEST_CASE("a drain calls back once everything enqueued on its streams has run",
          "[runtime][cuda][context]") {
  auto sim = std::make_shared<cuda::sim_api>(checked());
  std::shared_ptr<cuda_context> c = make_context(sim);
  cuda::stream_t a = c->stream(0, 0);
  cuda::stream_t b = c->stream(1, 0);
  std::promise<void> open_a = gate(*sim, 0, a);
  std::promise<void> open_b = gate(*sim, 1, b);
  std::atomic<int> ran{0};
  std::atomic<int> ran_when_drained{-1};
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*sim, 0);
    REQUIRE(sim->launch_host_func(a, [&] { ++ran; }) == cuda::error::success);
  }
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*sim, 1);
    REQUIRE(sim->launch_host_func(b, [&] { ++ran; }) == cuda::error::success);
  }
  std::promise<void> drained;
  c->drain({{0, a}, {1, b}}, [&] {
    ran_when_drained = ran.load();
    drained.set_value();
  });
  open_a.set_value();
  open_b.set_value();
  REQUIRE(drained.get_future().wait_for(30s) == std::future_status::ready);
  CHECK(ran_when_drained == 2);
  c->quiesce();

  // Nothing to drain: at once.
  bool at_once = false;
  c->drain({}, [&] { at_once = true; });
  CHECK(at_once);
}

TEST_CASE("memory whose free fails is reported and freed again at teardown",
          "[runtime][cuda][context]") {
  auto sim = std::make_shared<cuda::sim_api>(checked());
  std::shared_ptr<cuda_context> c = make_context(sim);
  cuda::stream_t s = c->stream(1, 0);
  void* kept = nullptr;
  void* freed = nullptr;
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*sim, 1);
    REQUIRE(sim->malloc_async(&kept, 1024, s) == cuda::error::success);
    REQUIRE(sim->malloc_async(&freed, 2048, s) == cuda::error::success);
  }
  CHECK(sim->device_bytes_in_use(1) == 3072);
  sim->fail_call("cudaFreeAsync", 1, cuda::error::invalid_value);
  require_status(c->release_memory(1, kept, s), absl::StatusCode::kInvalidArgument,
                 {"cudaFreeAsync", "cuda:1"});
  CHECK(c->release_memory(1, freed, s).ok());
  CHECK(wait(c->record(1, s)).ok());
  c->quiesce();
  CHECK(sim->device_bytes_in_use(1) == 1024);
  c.reset();
  CHECK(sim->device_bytes_in_use(1) == 0);
}

TEST_CASE("the producer's stream is recorded on its own GPU, or not at all for no_sync",
          "[runtime][cuda][context]") {
  auto sim = std::make_shared<cuda::sim_api>(checked());
  std::shared_ptr<cuda_context> c = make_context(sim);

  marker_ptr none = c->record_producer(0, stream_no_sync);
  CHECK(none->done());
  CHECK(failed_at_once(none).ok());

  // A stream handle of GPU 1 for a tensor of GPU 0: recorded with an event
  // of GPU 1 (an event of GPU 0 would break CUDA's rule, which the
  // simulation reports).
  cuda::stream_t producer = c->stream(1, 1);
  std::promise<void> open = gate(*sim, 1, producer);
  marker_ptr m = c->record_producer(0, reinterpret_cast<std::int64_t>(producer));
  CHECK_FALSE(m->done());
  CHECK(failed_at_once(m).ok());

  // The consumer's stream of GPU 1 waits for it on the device.
  cuda::stream_t consumer = c->stream(1, 0);
  REQUIRE(
      c->order_consumer({device_kind::cuda, 1}, reinterpret_cast<std::int64_t>(consumer), m).ok());
  std::atomic<bool> producer_done{false};
  std::atomic<bool> consumer_saw{false};
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*sim, 1);
    REQUIRE(sim->launch_host_func(producer, [&] { producer_done = true; }) == cuda::error::success);
    REQUIRE(sim->launch_host_func(consumer, [&] { consumer_saw = true; }) == cuda::error::success);
  }
  marker_ptr consumed = c->record(1, consumer);
  c->quiesce();
  CHECK_FALSE(consumed->done());  // held behind the gated producer
  open.set_value();
  CHECK(wait(consumed).ok());
  CHECK(consumer_saw);

  // The legacy default stream of the tensor's GPU, as this thread sees it.
  CHECK(wait(c->record_producer(0, stream_legacy_default)).ok());
  CHECK(wait(c->record_producer(1, stream_per_thread_default)).ok());

  // A completed marker needs no wait; one of no stream of this context
  // makes the caller wait on the host.
  CHECK(c->order_consumer({device_kind::cuda, 0}, stream_legacy_default, none).ok());
  auto foreign = std::make_shared<completion_marker>();
  require_status(c->order_consumer({device_kind::cuda, 0}, stream_legacy_default, foreign),
                 absl::StatusCode::kUnimplemented, {"finishes on the host"});
  foreign->complete(absl::OkStatus());
  c->quiesce();
}

TEST_CASE("device_of tells device, managed, pinned and pageable memory apart",
          "[runtime][cuda][context]") {
  auto sim = std::make_shared<cuda::sim_api>(checked());
  std::shared_ptr<cuda_context> c = make_context(sim);
  void* on_gpu = nullptr;
  void* managed = nullptr;
  void* pinned = nullptr;
  {
    absl::StatusOr<device_guard> on = device_guard::enter(*sim, 1);
    REQUIRE(on.ok());
    REQUIRE(sim->malloc_device(&on_gpu, 256) == cuda::error::success);
    REQUIRE(sim->malloc_managed(&managed, 256) == cuda::error::success);
    REQUIRE(sim->malloc_host(&pinned, 256) == cuda::error::success);
  }
  std::vector<char> pageable(256);

  absl::StatusOr<std::optional<device>> d = c->device_of(on_gpu);
  REQUIRE(d.ok());
  CHECK(*d == std::optional(device{device_kind::cuda, 1}));
  // Inside the allocation, not only at its start.
  d = c->device_of(static_cast<char*>(on_gpu) + 100);
  REQUIRE(d.ok());
  CHECK(*d == std::optional(device{device_kind::cuda, 1}));
  d = c->device_of(managed);
  REQUIRE(d.ok());
  CHECK(*d == std::optional(device{device_kind::cuda_managed, 1}));
  d = c->device_of(pinned);
  REQUIRE(d.ok());
  CHECK(*d == std::optional(device{device_kind::cuda_host, 0}));
  d = c->device_of(pageable.data());
  REQUIRE(d.ok());
  CHECK_FALSE(d->has_value());

  sim->fail_call("cudaPointerGetAttributes", 1, cuda::error::initialization_error);
  d = c->device_of(on_gpu);
  require_status(d.status(), absl::StatusCode::kUnavailable,
                 {"cudaPointerGetAttributes", "cudaErrorInitializationError"});

  REQUIRE(sim->free_device(on_gpu) == cuda::error::success);
  REQUIRE(sim->free_device(managed) == cuda::error::success);
  REQUIRE(sim->free_host(pinned) == cuda::error::success);
}

}  // namespace dlasync::detail
