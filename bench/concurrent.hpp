// Many coroutines at once on a runtime's executor, for the benchmarks of
// small imports: each iteration spawns `coroutines` coroutines running
// `body(c)` (c: the coroutine's index) and waits until all have finished;
// items per second is coroutines x items_each per iteration.
#pragma once

#include <benchmark/benchmark.h>

#include <atomic>
#include <future>

#include "asio/awaitable.hpp"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "dlasync/dlasync.hpp"

namespace dlasync::bench {

template <typename Body>
void run_concurrently(benchmark::State& state, dlasync::runtime& rt, int coroutines, int items_each,
                      Body body) {
  for (auto _ : state) {
    std::atomic<int> left{coroutines};
    std::promise<void> all_done;
    for (int c = 0; c < coroutines; ++c) {
      asio::co_spawn(
          rt.get_executor(),
          [&, c]() -> asio::awaitable<void> {
            co_await body(c);
            if (left.fetch_sub(1) == 1) all_done.set_value();
          },
          asio::detached);
    }
    all_done.get_future().wait();
  }
  state.SetItemsProcessed(state.iterations() * coroutines * items_each);
}

}  // namespace dlasync::bench
