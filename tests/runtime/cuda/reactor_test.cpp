// The CUDA reactor on a simulated GPU: it calls each watched event's
// callback exactly once, on its own thread, once the event completes; a
// query that fails now and then is asked again and its error reported when
// the event completes, one that keeps failing ends the watch; quiesce waits
// for the round of callbacks under way; the destructor stops the thread
// with events still watched and calls none of them.
#include "runtime/src/cuda/reactor.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"
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

// A stream of a simulated GPU held by a host function until `open()`, and
// events recorded on it behind that gate.
class gated_stream {
 public:
  gated_stream(cuda::sim_api& sim, int device) : sim_(sim), device_(device) {
    REQUIRE(sim_.set_device(device_) == cuda::error::success);
    REQUIRE(sim_.stream_create(&stream_) == cuda::error::success);
    std::shared_future<void> gate = gate_.get_future().share();
    REQUIRE(sim_.launch_host_func(stream_, [gate] { gate.wait(); }) == cuda::error::success);
  }
  gated_stream(const gated_stream&) = delete;
  gated_stream& operator=(const gated_stream&) = delete;
  ~gated_stream() {
    open();
    (void)sim_.set_device(device_);
    for (cuda::event_t e : events_) (void)sim_.event_destroy(e);
    (void)sim_.stream_destroy(stream_);
  }

  cuda::event_t record() {
    (void)sim_.set_device(device_);
    cuda::event_t e = nullptr;
    REQUIRE(sim_.event_create(&e) == cuda::error::success);
    REQUIRE(sim_.event_record(e, stream_) == cuda::error::success);
    events_.push_back(e);
    return e;
  }

  void open() {
    if (!opened_) gate_.set_value();
    opened_ = true;
  }

 private:
  cuda::sim_api& sim_;
  const int device_;
  cuda::stream_t stream_ = nullptr;
  std::promise<void> gate_;
  bool opened_ = false;
  std::vector<cuda::event_t> events_;
};

// Counts a callback's calls and keeps what the first one saw.
struct call_record {
  std::atomic<int> calls{0};
  std::atomic<bool> on_reactor{false};
  absl::Status status;
  std::promise<void> first;

  std::function<void(absl::Status)> callback(const reactor& r) {
    return [this, &r](absl::Status s) {
      if (calls++ == 0) {
        on_reactor = r.on_reactor_thread();
        status = std::move(s);
        first.set_value();
      }
    };
  }
};

}  // namespace

TEST_CASE("the reactor calls a watched event's callback once, on its thread, when it completes",
          "[runtime][cuda][reactor]") {
  cuda::sim_api sim(checked());
  gated_stream s(sim, 1);
  std::vector<std::unique_ptr<call_record>> records;
  std::vector<std::future<void>> firsts;
  {
    reactor r(sim);
    CHECK_FALSE(r.on_reactor_thread());
    for (int i = 0; i < 8; ++i) {
      records.push_back(std::make_unique<call_record>());
      firsts.push_back(records.back()->first.get_future());
      r.watch(1, s.record(), records.back()->callback(r));
    }
    // Gated: whatever rounds the reactor ran, no call yet.
    r.quiesce();
    for (const auto& rec : records) CHECK(rec->calls == 0);
    s.open();
    for (std::future<void>& f : firsts) REQUIRE(f.wait_for(30s) == std::future_status::ready);
    r.quiesce();
  }
  for (const auto& rec : records) {
    CHECK(rec->calls == 1);
    CHECK(rec->on_reactor);
    CHECK(rec->status.ok());
  }
}

TEST_CASE("a query that fails once is asked again and its error reported when the event completes",
          "[runtime][cuda][reactor]") {
  cuda::sim_api sim(checked());
  gated_stream s(sim, 0);
  call_record rec;
  std::future<void> first = rec.first.get_future();
  reactor r(sim);
  sim.fail_call("cudaEventQuery", 1, cuda::error::launch_failure);
  r.watch(0, s.record(), rec.callback(r));
  // Polled past the failed query: the event has not completed, no call.
  const auto deadline = std::chrono::steady_clock::now() + 30s;  // a hang guard
  while (sim.call_counts()["cudaEventQuery"] < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  r.quiesce();
  CHECK(rec.calls == 0);
  s.open();
  REQUIRE(first.wait_for(30s) == std::future_status::ready);
  r.quiesce();
  CHECK(rec.calls == 1);
  require_status(rec.status, absl::StatusCode::kInternal,
                 {"cudaEventQuery", "cuda:0", "cudaErrorLaunchFailure"});
}

TEST_CASE("a query that keeps failing ends the watch with its error before the event completes",
          "[runtime][cuda][reactor]") {
  cuda::sim_api sim(checked());
  gated_stream s(sim, 1);
  call_record rec;
  std::future<void> first = rec.first.get_future();
  reactor r(sim);
  for (int nth = 1; nth <= 3; ++nth) sim.fail_call("cudaEventQuery", nth, cuda::error::unknown);
  r.watch(1, s.record(), rec.callback(r));
  // The stream stays gated: only the failures can end this watch.
  REQUIRE(first.wait_for(30s) == std::future_status::ready);
  CHECK(rec.calls == 1);
  CHECK(rec.on_reactor);
  require_status(rec.status, absl::StatusCode::kInternal,
                 {"cudaEventQuery", "cuda:1", "cudaErrorUnknown"});
  s.open();
  r.quiesce();
  CHECK(rec.calls == 1);
}

TEST_CASE("quiesce waits for the round of callbacks under way and returns at once inside one",
          "[runtime][cuda][reactor]") {
  cuda::sim_api sim(checked());
  gated_stream s(sim, 0);
  s.open();
  reactor r(sim);
  std::promise<void> entered;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> finished{false};
  std::atomic<bool> quiesced_inside{false};
  r.watch(0, s.record(), [&, released](const absl::Status&) {
    r.quiesce();  // from a callback: returns at once instead of waiting for itself
    quiesced_inside = true;
    entered.set_value();
    released.wait();
    finished = true;
  });
  REQUIRE(entered.get_future().wait_for(30s) == std::future_status::ready);
  CHECK(quiesced_inside);
  // A quiesce from outside returns only after the callback it found running.
  std::atomic<bool> finished_when_quiesced{false};
  std::thread waiter([&] {
    r.quiesce();
    finished_when_quiesced = finished.load();
  });
  release.set_value();
  waiter.join();
  CHECK(finished_when_quiesced);
}

TEST_CASE("the reactor stops with events still watched and calls none of them",
          "[runtime][cuda][reactor]") {
  cuda::sim_api sim(checked());
  gated_stream s(sim, 0);
  std::atomic<int> calls{0};
  {
    reactor r(sim);
    for (int i = 0; i < 4; ++i) r.watch(0, s.record(), [&](const absl::Status&) { ++calls; });
    r.quiesce();
  }  // the events are still gated
  s.open();
  CHECK(calls == 0);
}

}  // namespace dlasync::detail
