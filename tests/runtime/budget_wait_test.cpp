// The budget-wait protocol that imports, batches and remote imports share:
// each grant handler runs once, and a cancellation ends a wait whenever it
// comes, before its ticket is known included.
#include "runtime/src/budget_wait.hpp"

#include <atomic>
#include <cstdint>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"

namespace dlasync::detail {
namespace {

// A grant handler that records what it got, and ends the wait first as the
// operations do.
struct handler_log {
  std::atomic<int> calls{0};
  std::optional<absl::Status> status;
};

memory_budget::grant_fn handler(budget_wait& wait, handler_log& log) {
  return [&wait, &log](absl::Status s) {
    wait.end();
    log.status = std::move(s);
    log.calls.fetch_add(1);
  };
}

std::uint64_t plain_acquire(memory_budget& budget, std::uint64_t bytes,
                            memory_budget::grant_fn granted) {
  return budget.acquire(bytes, std::move(granted));
}

}  // namespace

TEST_CASE("a grant at once ends the wait inside begin", "[runtime][budget]") {
  memory_budget budget(100);
  budget_wait wait(budget);
  handler_log log;
  wait.begin(60, handler(wait, log), [&](std::uint64_t b, memory_budget::grant_fn g) {
    return plain_acquire(budget, b, std::move(g));
  });
  CHECK(log.calls == 1);
  CHECK(log.status->ok());
  CHECK_FALSE(wait.waiting());
  CHECK(wait.cancel(absl::CancelledError("late")) == budget_wait::outcome::not_waiting);
  CHECK(budget.in_use() == 60);
}

TEST_CASE("a request over the whole budget is refused with the one rule", "[runtime][budget]") {
  memory_budget budget(100);
  budget_wait wait(budget);
  handler_log log;
  wait.begin(101, handler(wait, log), [&](std::uint64_t b, memory_budget::grant_fn g) {
    return plain_acquire(budget, b, std::move(g));
  });
  REQUIRE(log.calls == 1);
  CHECK(log.status->code() == absl::StatusCode::kResourceExhausted);
  CHECK(log.status->message() ==
        "a copy needs 101 bytes, more than the whole copy memory budget of 100 bytes; not "
        "consumed: raise runtime_options::copy_memory_budget");
  CHECK(within_budget("a copy", 100, 100).ok());
  CHECK(within_budget("a copy", 1 << 30, 0).ok());  // 0: unlimited
}

TEST_CASE("a cancel ends a wait under way, and the handler runs once with it",
          "[runtime][budget]") {
  memory_budget budget(100);
  REQUIRE(budget.try_acquire(100));
  budget_wait wait(budget);
  handler_log log;
  wait.begin(50, handler(wait, log), [&](std::uint64_t b, memory_budget::grant_fn g) {
    return plain_acquire(budget, b, std::move(g));
  });
  CHECK(wait.waiting());
  CHECK(log.calls == 0);
  CHECK(wait.cancel(absl::CancelledError("stop")) == budget_wait::outcome::ended);
  CHECK(log.calls == 1);
  CHECK(log.status->code() == absl::StatusCode::kCancelled);
  // The bytes come back and nobody is granted them twice.
  budget.release(100);
  CHECK(log.calls == 1);
  CHECK(budget.in_use() == 0);
  CHECK(wait.cancel(absl::CancelledError("again")) == budget_wait::outcome::not_waiting);
}

TEST_CASE("a cancel before begin ends the wait once its ticket is known", "[runtime][budget]") {
  memory_budget budget(100);
  REQUIRE(budget.try_acquire(100));
  budget_wait wait(budget);
  handler_log log;
  CHECK(wait.cancel(absl::CancelledError("before")) == budget_wait::outcome::deferred);
  wait.begin(50, handler(wait, log), [&](std::uint64_t b, memory_budget::grant_fn g) {
    return plain_acquire(budget, b, std::move(g));
  });
  REQUIRE(log.calls == 1);
  CHECK(log.status->code() == absl::StatusCode::kCancelled);
  CHECK(log.status->message() == "before");
  CHECK(budget.waiting() == 0);
}

TEST_CASE("a cancel while the ticket is not known yet is carried out after", "[runtime][budget]") {
  memory_budget budget(100);
  REQUIRE(budget.try_acquire(100));
  budget_wait wait(budget);
  handler_log log;
  std::optional<budget_wait::outcome> seen;
  // The cancel lands inside the acquire, after the budget queued the
  // request and before begin learned its ticket.
  wait.begin(50, handler(wait, log), [&](std::uint64_t b, memory_budget::grant_fn g) {
    const std::uint64_t ticket = plain_acquire(budget, b, std::move(g));
    seen = wait.cancel(absl::CancelledError("meanwhile"));
    return ticket;
  });
  CHECK(seen == budget_wait::outcome::deferred);
  REQUIRE(log.calls == 1);
  CHECK(log.status->message() == "meanwhile");
  CHECK(budget.waiting() == 0);
}

TEST_CASE("a cancel that comes after the grant says the grant is on its way", "[runtime][budget]") {
  memory_budget budget(100);
  REQUIRE(budget.try_acquire(100));
  budget_wait wait(budget);
  // The operation's hand-off: the grant handler has not run yet.
  std::vector<absl::Status> posted;
  wait.begin(
      50, [&](absl::Status s) { posted.push_back(std::move(s)); },
      [&](std::uint64_t b, memory_budget::grant_fn g) {
        return plain_acquire(budget, b, std::move(g));
      });
  budget.release(50);  // granted: its handler waits in `posted`
  REQUIRE(posted.size() == 1);
  CHECK(posted[0].ok());
  CHECK(wait.cancel(absl::CancelledError("late")) == budget_wait::outcome::granted);
  wait.end();  // the handler runs, and gives the bytes back
  budget.release(50);
  CHECK(wait.cancel(absl::CancelledError("later")) == budget_wait::outcome::not_waiting);
  CHECK(budget.in_use() == 50);
}

TEST_CASE("cancels racing grants: every handler runs once, no byte is lost", "[runtime][budget]") {
  memory_budget budget(64);
  for (int round = 0; round < 200; ++round) {
    REQUIRE(budget.try_acquire(64));
    budget_wait wait(budget);
    std::atomic<int> calls{0};
    wait.begin(
        48,
        [&](const absl::Status& s) {
          wait.end();
          if (s.ok()) budget.release(48);  // the copy is done at once
          calls.fetch_add(1);
        },
        [&](std::uint64_t b, memory_budget::grant_fn g) {
          return plain_acquire(budget, b, std::move(g));
        });
    std::thread canceller([&] { (void)wait.cancel(absl::CancelledError("race")); });
    budget.release(64);  // grants the wait unless the cancel came first
    canceller.join();
    CHECK(calls == 1);
    CHECK(budget.in_use() == 0);
    CHECK(budget.waiting() == 0);
  }
}

}  // namespace dlasync::detail
