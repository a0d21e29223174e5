// Many coroutines at once on a runtime's executor, for the benchmarks of
// small imports: one round spawns `coroutines` coroutines running `body(c)`
// (c: the coroutine's index) and waits until all have finished.
#pragma once

#include <benchmark/benchmark.h>

#include <atomic>
#include <future>

#include "asio/awaitable.hpp"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "dlasync/dlasync.hpp"

namespace dlasync::bench {

// One round.
template <typename Body>
void run_concurrently(dlasync::runtime& rt, int coroutines, Body& body) {
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

// A round per iteration; items per second is coroutines x items_each per
// iteration.
template <typename Body>
void run_concurrently(benchmark::State& state, dlasync::runtime& rt, int coroutines, int items_each,
                      Body body) {
  for (auto _ : state) run_concurrently(rt, coroutines, body);
  state.SetItemsProcessed(state.iterations() * coroutines * items_each);
}

}  // namespace dlasync::bench
