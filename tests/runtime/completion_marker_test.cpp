// The completion marker: a one-shot signal with a status. It completes once
// (the first status counts), runs each callback exactly once (at once on
// the registering thread when already done, else on the completing
// thread), and its two helpers tell a marker made completed from one still
// pending.
#include "runtime/src/completion_marker.hpp"

#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "catch2/catch.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using testing::require_status;

}  // namespace

TEST_CASE("a marker runs its callbacks once, on the completing thread, with the first status",
          "[runtime][marker]") {
  completion_marker m;
  CHECK_FALSE(m.done());
  std::atomic<int> calls{0};
  std::vector<std::thread::id> threads(2);
  std::vector<absl::Status> seen(2);
  for (int i = 0; i < 2; ++i) {
    m.on_complete([&, i](absl::Status s) {
      ++calls;
      threads[static_cast<std::size_t>(i)] = std::this_thread::get_id();
      seen[static_cast<std::size_t>(i)] = std::move(s);
    });
  }
  CHECK(calls == 0);  // nothing runs before the marker completes
  std::thread completer([&] { m.complete(absl::DataLossError("first")); });
  const std::thread::id completer_id = completer.get_id();
  completer.join();
  CHECK(m.done());
  REQUIRE(calls == 2);
  for (int i = 0; i < 2; ++i) {
    CHECK(threads[static_cast<std::size_t>(i)] == completer_id);
    require_status(seen[static_cast<std::size_t>(i)], absl::StatusCode::kDataLoss, {"first"});
  }
  // Only the first completion counts: no callback runs again, and later
  // callbacks see the first status.
  m.complete(absl::OkStatus());
  CHECK(calls == 2);
  absl::Status later;
  m.on_complete([&](absl::Status s) { later = std::move(s); });
  require_status(later, absl::StatusCode::kDataLoss, {"first"});
}

TEST_CASE("a callback registered after completion runs at once on the registering thread",
          "[runtime][marker]") {
  completion_marker m;
  m.complete(absl::OkStatus());
  std::thread::id ran_on;
  int calls = 0;
  m.on_complete([&](const absl::Status& s) {
    CHECK(s.ok());
    ran_on = std::this_thread::get_id();
    ++calls;
  });
  CHECK(calls == 1);  // inside the call
  CHECK(ran_on == std::this_thread::get_id());
}

TEST_CASE("on_complete_unless_done registers when pending and hands the status back when done",
          "[runtime][marker]") {
  int calls = 0;
  completion_marker::callback fn = [&calls](const absl::Status&) { ++calls; };
  completion_marker pending;
  CHECK_FALSE(pending.on_complete_unless_done(fn).has_value());
  CHECK(calls == 0);
  pending.complete(absl::OkStatus());
  CHECK(calls == 1);  // it was registered

  completion_marker finished;
  finished.complete(absl::CancelledError("stopped"));
  completion_marker::callback mine = [&calls](const absl::Status&) { ++calls; };
  const std::optional<absl::Status> status = finished.on_complete_unless_done(mine);
  REQUIRE(status.has_value());
  require_status(*status, absl::StatusCode::kCancelled, {"stopped"});
  // Left alone for the caller to run where it should.
  CHECK(calls == 1);
  REQUIRE(static_cast<bool>(mine));
  std::move(mine)(*status);
  CHECK(calls == 2);
}

TEST_CASE("done_marker is completed with its status and failed_at_once reads it",
          "[runtime][marker]") {
  const marker_ptr failed = done_marker(absl::ResourceExhaustedError("no memory"));
  CHECK(failed->done());
  require_status(failed_at_once(failed), absl::StatusCode::kResourceExhausted, {"no memory"});

  const marker_ptr ok = done_marker(absl::OkStatus());
  CHECK(ok->done());
  CHECK(failed_at_once(ok).ok());

  // A marker still pending did not fail at once, and asking registers
  // nothing that a later completion would run.
  auto pending = std::make_shared<completion_marker>();
  CHECK(failed_at_once(pending).ok());
  pending->complete(absl::InternalError("later"));
  require_status(failed_at_once(pending), absl::StatusCode::kInternal, {"later"});
}

TEST_CASE("callbacks registered while another thread completes each run exactly once",
          "[runtime][marker]") {
  constexpr int threads = 4;
  constexpr int per_thread = 200;
  for (int round = 0; round < 20; ++round) {
    auto m = std::make_shared<completion_marker>();
    std::atomic<int> calls{0};
    std::atomic<int> ready{0};
    std::vector<std::thread> registrars;
    for (int t = 0; t < threads; ++t) {
      registrars.emplace_back([&] {
        ++ready;
        for (int i = 0; i < per_thread; ++i) {
          // Counted only when OK: Catch's assertions are not for threads.
          m->on_complete([&calls](const absl::Status& s) {
            if (s.ok()) ++calls;
          });
        }
      });
    }
    while (ready < threads) std::this_thread::yield();
    m->complete(absl::OkStatus());
    for (std::thread& t : registrars) t.join();
    REQUIRE(calls == threads * per_thread);
  }
}

}  // namespace dlasync
