// The hand-off of completions: attached, a task runs on the workers and
// never inside the call; detached (or never attached), it runs inline on
// the calling thread; either way each task runs exactly once, also when a
// detach races with calls from other threads.
#include "runtime/src/handoff.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "runtime/src/work_pool.hpp"

namespace dlasync::detail {
namespace {

using namespace std::chrono_literals;

}  // namespace

TEST_CASE("a hand-off never attached runs each task inline", "[runtime][handoff]") {
  handoff h;
  std::thread::id ran_on;
  int calls = 0;
  // Move-only, as the reactor's completions are.
  auto owned = std::make_unique<int>(7);
  h.run([&, owned = std::move(owned)] {
    ran_on = std::this_thread::get_id();
    calls += *owned == 7 ? 1 : 100;
  });
  CHECK(calls == 1);
  CHECK(ran_on == std::this_thread::get_id());
}

TEST_CASE("an attached hand-off posts to the workers, never inside the call",
          "[runtime][handoff]") {
  work_pool pool(1, 0ns);
  handoff h;
  h.attach(pool);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> on_worker{false};
  std::promise<void> ran;
  std::future<void> ran_future = ran.get_future();
  // The task waits for the caller to let it go: had it run inside run(),
  // run() would never return.
  h.run([&, released] {
    released.wait();
    on_worker = pool.running_in_this_thread();
    ran.set_value();
  });
  release.set_value();
  REQUIRE(ran_future.wait_for(30s) == std::future_status::ready);  // hang guard
  CHECK(on_worker);
  h.detach();
  pool.drain();
}

TEST_CASE("after detach returns, tasks run inline on the calling thread", "[runtime][handoff]") {
  work_pool pool(1, 0ns);
  handoff h;
  h.attach(pool);
  h.detach();
  pool.drain();  // posting now would be an error
  std::thread::id ran_on;
  h.run([&] { ran_on = std::this_thread::get_id(); });
  CHECK(ran_on == std::this_thread::get_id());
}

TEST_CASE("every task runs exactly once while a detach races with calls", "[runtime][handoff]") {
  constexpr int threads = 4;
  constexpr int per_thread = 250;
  for (int round = 0; round < 10; ++round) {
    work_pool pool(2, 0ns);
    handoff h;
    h.attach(pool);
    std::atomic<int> calls{0};
    std::atomic<int> ready{0};
    std::vector<std::thread> callers;
    for (int t = 0; t < threads; ++t) {
      callers.emplace_back([&] {
        ++ready;
        for (int i = 0; i < per_thread; ++i) h.run([&calls] { ++calls; });
      });
    }
    while (ready < threads) std::this_thread::yield();
    h.detach();
    // Everything posted before the detach returned is in the pool: once
    // drained, nothing more reaches it, and the rest ran inline.
    pool.drain();
    for (std::thread& t : callers) t.join();
    REQUIRE(calls == threads * per_thread);
  }
}

}  // namespace dlasync::detail
