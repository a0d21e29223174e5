#include "dlasync/memory_budget.hpp"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"

namespace dlasync {

TEST_CASE("a request that fits is granted at once", "[runtime][budget]") {
  memory_budget budget(100);
  int granted = 0;
  budget.acquire(60, [&](const absl::Status& s) { granted += s.ok(); });
  CHECK(granted == 1);
  CHECK(budget.in_use() == 60);
  budget.release(60);
  CHECK(budget.in_use() == 0);
}

TEST_CASE("requests wait in arrival order until memory is released", "[runtime][budget]") {
  memory_budget budget(100);
  std::vector<int> order;
  budget.acquire(80, [&](const absl::Status&) { order.push_back(0); });
  budget.acquire(50, [&](const absl::Status& s) { order.push_back(s.ok() ? 1 : -1); });
  budget.acquire(10, [&](const absl::Status& s) { order.push_back(s.ok() ? 2 : -2); });
  CHECK(order == std::vector<int>{0});  // the 10 waits behind the 50: no overtaking
  CHECK(budget.waiting() == 2);
  budget.release(80);
  CHECK(order == std::vector<int>{0, 1, 2});
  CHECK(budget.in_use() == 60);
}

TEST_CASE("a request above the whole budget is refused at once", "[runtime][budget]") {
  memory_budget budget(100);
  absl::Status seen;
  budget.acquire(101, [&](const absl::Status& s) { seen = s; });
  CHECK(seen.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(seen.message()).find("101 bytes") != std::string::npos);
  CHECK(std::string(seen.message()).find("copy_memory_budget") != std::string::npos);
}

TEST_CASE("a cancelled wait ends with the given status and lets others in", "[runtime][budget]") {
  memory_budget budget(100);
  budget.acquire(60, [](const absl::Status&) {});
  absl::Status big = absl::UnknownError("not called");
  absl::Status small = absl::UnknownError("not called");
  const std::uint64_t ticket = budget.acquire(70, [&](const absl::Status& s) { big = s; });
  budget.acquire(30, [&](const absl::Status& s) { small = s; });
  CHECK(small.code() == absl::StatusCode::kUnknown);  // waiting behind the 70
  CHECK(budget.cancel(ticket, absl::CancelledError("gone")));
  CHECK(big.code() == absl::StatusCode::kCancelled);
  CHECK(small.ok());
  CHECK_FALSE(budget.cancel(ticket, absl::CancelledError("again")));
}

TEST_CASE("try_acquire grants only what fits with nobody waiting", "[runtime][budget]") {
  memory_budget budget(100);
  CHECK(budget.try_acquire(60));
  CHECK_FALSE(budget.try_acquire(50));   // does not fit now
  CHECK_FALSE(budget.try_acquire(101));  // never fits: the caller reports that
  CHECK(budget.in_use() == 60);
  absl::Status waiter = absl::UnknownError("not called");
  budget.acquire(50, [&](const absl::Status& s) { waiter = s; });
  CHECK(budget.waiting() == 1);
  CHECK_FALSE(budget.try_acquire(10));  // would overtake the waiter
  budget.release(60);
  CHECK(waiter.ok());
  CHECK(budget.try_acquire(50));
  CHECK(budget.in_use() == 100);
  memory_budget unlimited(0);
  CHECK(unlimited.try_acquire(std::uint64_t{1} << 40));
}

TEST_CASE("an unlimited budget never waits", "[runtime][budget]") {
  memory_budget budget(0);
  int granted = 0;
  for (int i = 0; i < 3; ++i)
    budget.acquire(std::uint64_t{1} << 40, [&](const absl::Status& s) { granted += s.ok(); });
  CHECK(granted == 3);
}

// The fast path takes no lock: a release that sees nobody waiting returns
// at once. A request that starts to wait while such a release gives its bytes
// back must still be granted (no lost wake-up), and no grant may exceed the
// limit. Threads mix try_acquire, acquire and release on a small budget;
// every wait must end, and everything must come back.
TEST_CASE("grants and releases from many threads lose no waiter", "[runtime][budget]") {
  constexpr std::uint64_t limit = 64;
  memory_budget budget(limit);
  constexpr int threads = 4;
  constexpr int rounds = 4000;
  std::atomic<int> stuck{0};
  std::atomic<int> over{0};
  std::atomic<int> granted{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        const std::uint64_t bytes = 1 + static_cast<std::uint64_t>((i * 7 + t * 13) % 40);
        if ((i + t) % 3 == 0 && budget.try_acquire(bytes)) {
          if (budget.in_use() > limit) over.fetch_add(1);
          granted.fetch_add(1);
          budget.release(bytes);
          continue;
        }
        // Shared: a grant after this thread gave up must find it alive.
        auto done = std::make_shared<std::atomic<bool>>(false);
        budget.acquire(bytes, [done](const absl::Status& s) {
          if (s.ok()) done->store(true, std::memory_order_release);
        });
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (!done->load(std::memory_order_acquire)) {
          if (std::chrono::steady_clock::now() > until) {
            stuck.fetch_add(1);
            return;
          }
          std::this_thread::yield();
        }
        if (budget.in_use() > limit) over.fetch_add(1);
        granted.fetch_add(1);
        budget.release(bytes);
      }
    });
  }
  for (std::thread& th : pool) th.join();
  CHECK(stuck.load() == 0);
  CHECK(over.load() == 0);
  CHECK(granted.load() == threads * rounds);
  CHECK(budget.in_use() == 0);
  CHECK(budget.waiting() == 0);
}

}  // namespace dlasync
