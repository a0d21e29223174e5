// The releaser: tasks run one at a time, in the order handed over, on a
// thread of its own that the first task starts; drain() returns once every
// task has run, those handed over meanwhile included; afterwards a task runs
// on the thread that hands it over.
#include "runtime/src/releaser.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"

namespace dlasync::detail {
namespace {

// What the tasks saw: the order they ran in and the threads they ran on.
struct journal {
  std::mutex mutex;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  void note(int n) {
    std::lock_guard lock(mutex);
    order.push_back(n);
    threads.push_back(std::this_thread::get_id());
  }
  std::vector<int> seen() {
    std::lock_guard lock(mutex);
    return order;
  }
};

}  // namespace

TEST_CASE("tasks run in the order handed over, on one thread that is not the caller's",
          "[runtime][releaser]") {
  journal j;
  releaser r;
  for (int i = 0; i < 100; ++i) r.post([&j, i] { j.note(i); });
  r.drain();
  std::vector<int> expected(100);
  for (int i = 0; i < 100; ++i) expected[static_cast<std::size_t>(i)] = i;
  CHECK(j.seen() == expected);
  for (const std::thread::id& t : j.threads) {
    CHECK(t == j.threads.front());
    CHECK(t != std::this_thread::get_id());
  }
}

TEST_CASE("a task that blocks holds up the tasks behind it, never the caller",
          "[runtime][releaser]") {
  journal j;
  releaser r;
  std::promise<void> entered;
  std::promise<void> open;
  std::shared_future<void> gate = open.get_future().share();
  r.post([&] {
    entered.set_value();
    gate.wait();
    j.note(1);
  });
  r.post([&j] { j.note(2); });
  entered.get_future().wait();
  // The caller goes on while the first task blocks, and hands over more.
  r.post([&j] { j.note(3); });
  CHECK(j.seen().empty());
  open.set_value();
  r.drain();
  CHECK(j.seen() == std::vector<int>{1, 2, 3});
}

TEST_CASE("drain waits for the tasks that tasks hand over, then later ones run in place",
          "[runtime][releaser]") {
  journal j;
  releaser r;
  // A task handing over another, as a deleter that starts an import does:
  // it runs after the one that handed it over, and drain waits for it.
  r.post([&] {
    r.post([&j] { j.note(2); });
    j.note(1);
  });
  r.drain();
  CHECK(j.seen() == std::vector<int>{1, 2});
  const std::thread::id releaser_thread = j.threads.front();
  // Drained: a task handed over now runs at once, on this thread.
  r.post([&j] { j.note(3); });
  CHECK(j.seen() == std::vector<int>{1, 2, 3});
  CHECK(j.threads.back() == std::this_thread::get_id());
  CHECK(j.threads.back() != releaser_thread);
  r.drain();  // again: nothing to do
}

TEST_CASE("concurrent drains all return once every task has run", "[runtime][releaser]") {
  releaser r;
  std::promise<void> entered;
  std::promise<void> open;
  std::shared_future<void> gate = open.get_future().share();
  std::atomic<bool> ran{false};
  r.post([&] {
    entered.set_value();
    gate.wait();
    ran = true;
  });
  entered.get_future().wait();
  std::atomic<int> returned_early{0};
  std::vector<std::thread> drainers;
  for (int i = 0; i < 3; ++i) {
    drainers.emplace_back([&] {
      r.drain();
      if (!ran.load()) ++returned_early;
    });
  }
  open.set_value();
  for (std::thread& t : drainers) t.join();
  CHECK(returned_early == 0);
  CHECK(ran);
}

TEST_CASE("a releaser never handed a task drains at once", "[runtime][releaser]") {
  releaser r;
  r.drain();
  bool ran = false;
  r.post([&] { ran = true; });
  CHECK(ran);  // here, inside the call
}

TEST_CASE("tasks handed over from many threads each run exactly once", "[runtime][releaser]") {
  constexpr int threads = 4;
  constexpr int each = 2500;
  std::vector<std::atomic<int>> runs(threads * each);
  {
    releaser r;
    std::vector<std::thread> posters;
    for (int t = 0; t < threads; ++t) {
      posters.emplace_back([&, t] {
        for (int i = 0; i < each; ++i) {
          r.post([&runs, n = t * each + i] { runs[static_cast<std::size_t>(n)].fetch_add(1); });
        }
      });
    }
    for (std::thread& p : posters) p.join();
  }  // the destructor drains
  int once = 0;
  for (const std::atomic<int>& n : runs) once += n.load() == 1;
  CHECK(once == threads * each);
}

}  // namespace dlasync::detail
