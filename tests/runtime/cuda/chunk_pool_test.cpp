// The pinned chunk pool on a simulated GPU: at most `count` chunks of
// `bytes` are out at a time, pinned with the home GPU current on first
// use; a take that finds none free waits, and returned chunks go to the
// waiters in arrival order on the returning thread; a failed pinning is
// the grant's error and leaves the pool empty for a retry; the pool frees
// every chunk when it goes.
#include "runtime/src/cuda/chunk_pool.hpp"

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"
#include "support/test_tensors.hpp"

namespace dlasync::detail {
namespace {

using testing::require_status;

cuda::sim_options checked() {
  cuda::sim_options so;
  so.check_order = true;
  so.on_report = cuda::report_action::collect;
  return so;
}

// Grants in the order they arrive, and on which thread.
struct grants {
  std::vector<absl::StatusOr<void*>> got;
  std::vector<std::thread::id> threads;

  chunk_pool::grant_fn next() {
    return [this](absl::StatusOr<void*> chunk) {
      got.push_back(std::move(chunk));
      threads.push_back(std::this_thread::get_id());
    };
  }
};

}  // namespace

TEST_CASE("the chunk pool hands out at most its count and serves waiters in order",
          "[runtime][cuda][chunks]") {
  cuda::sim_api sim(checked());
  auto in_use = std::make_shared<std::atomic<int>>(0);
  std::optional<chunk_pool> pool;
  pool.emplace(sim, 4096, 2, 1, in_use);
  CHECK(pool->chunk_bytes() == 4096);
  CHECK(pool->chunk_count() == 2);
  CHECK(sim.host_bytes_pinned() == 0);  // nothing pinned before first use

  grants first;
  pool->take(first.next());
  pool->take(first.next());
  REQUIRE(first.got.size() == 2);  // granted inside take
  REQUIRE(first.got[0].ok());
  REQUIRE(first.got[1].ok());
  CHECK(*first.got[0] != *first.got[1]);
  CHECK(first.threads[0] == std::this_thread::get_id());
  CHECK(*in_use == 2);
  CHECK(sim.host_bytes_pinned() == 2 * 4096);
  // Pinned with the home GPU current: no other GPU's context was opened.
  CHECK(sim.contexts() == std::vector<int>{1});
  for (void* chunk : {*first.got[0], *first.got[1]}) {
    cuda::pointer_attributes a;
    REQUIRE(sim.pointer_get_attributes(&a, chunk) == cuda::error::success);
    CHECK(a.type == cuda::memory_type::host);
  }

  // None free: the next takes wait, in arrival order, and pin no more.
  grants waiter_a;
  grants waiter_b;
  pool->take(waiter_a.next());
  pool->take(waiter_b.next());
  CHECK(waiter_a.got.empty());
  CHECK(waiter_b.got.empty());
  CHECK(sim.host_bytes_pinned() == 2 * 4096);

  // A returned chunk goes to the oldest waiter, on the returning thread.
  void* returned = *first.got[1];
  std::thread giver([&] { pool->give(returned); });
  const std::thread::id giver_id = giver.get_id();
  giver.join();
  REQUIRE(waiter_a.got.size() == 1);
  REQUIRE(waiter_a.got[0].ok());
  CHECK(*waiter_a.got[0] == returned);
  CHECK(waiter_a.threads[0] == giver_id);
  CHECK(waiter_b.got.empty());
  CHECK(*in_use == 2);  // handed on, not freed

  pool->give(*first.got[0]);
  REQUIRE(waiter_b.got.size() == 1);
  CHECK(*waiter_b.got[0] == *first.got[0]);

  // With nobody waiting, chunks go back to the free list.
  pool->give(*waiter_a.got[0]);
  pool->give(*waiter_b.got[0]);
  CHECK(*in_use == 0);
  grants again;
  pool->take(again.next());
  REQUIRE(again.got.size() == 1);
  CHECK(*in_use == 1);
  pool->give(*again.got[0]);

  // The counter outlives the pool (runtime::stats reads it after).
  pool.reset();
  CHECK(sim.host_bytes_pinned() == 0);
  CHECK(*in_use == 0);
}

TEST_CASE("a failed pinning is the grant's error and the pool retries on the next take",
          "[runtime][cuda][chunks]") {
  cuda::sim_api sim(checked());
  chunk_pool pool(sim, 4096, 3, 0);
  // The second of the three chunks cannot be pinned.
  sim.fail_call("cudaMallocHost", 2, cuda::error::memory_allocation);
  grants failed;
  pool.take(failed.next());
  REQUIRE(failed.got.size() == 1);
  require_status(failed.got[0].status(), absl::StatusCode::kResourceExhausted,
                 {"cudaMallocHost", "cudaErrorMemoryAllocation"});
  // The chunk pinned before the failure was given back.
  CHECK(sim.host_bytes_pinned() == 0);

  grants retried;
  for (int i = 0; i < 3; ++i) pool.take(retried.next());
  REQUIRE(retried.got.size() == 3);
  for (const absl::StatusOr<void*>& chunk : retried.got) REQUIRE(chunk.ok());
  CHECK(sim.host_bytes_pinned() == 3 * 4096);
  for (const absl::StatusOr<void*>& chunk : retried.got) pool.give(*chunk);
}

TEST_CASE("a pool whose home GPU cannot be entered reports it and pins nothing",
          "[runtime][cuda][chunks]") {
  cuda::sim_api sim(checked());
  chunk_pool pool(sim, 4096, 2, 7);  // the simulation has two GPUs
  grants failed;
  pool.take(failed.next());
  REQUIRE(failed.got.size() == 1);
  REQUIRE_FALSE(failed.got[0].ok());
  CHECK_THAT(std::string(failed.got[0].status().message()),
             Catch::Matchers::Contains("cudaSetDevice"));
  CHECK(sim.host_bytes_pinned() == 0);
}

TEST_CASE("the pool frees every chunk when it goes, those out included",
          "[runtime][cuda][chunks]") {
  cuda::sim_api sim(checked());
  {
    chunk_pool pool(sim, 1 << 16, 4, 0);
    grants out;
    pool.take(out.next());
    REQUIRE(out.got.size() == 1);
    REQUIRE(out.got[0].ok());
    CHECK(sim.host_bytes_pinned() == 4 * (1 << 16));
  }
  CHECK(sim.host_bytes_pinned() == 0);
}

TEST_CASE("threads taking and giving chunks never hold more than the count at once",
          "[runtime][cuda][chunks]") {
  cuda::sim_api sim(checked());
  auto in_use = std::make_shared<std::atomic<int>>(0);
  constexpr int count = 3;
  chunk_pool pool(sim, 256, count, 0, in_use);
  constexpr int threads = 6;
  constexpr int per_thread = 200;
  std::atomic<int> held{0};
  std::atomic<int> most{0};
  std::atomic<int> granted{0};
  std::atomic<int> errors{0};
  std::mutex seen_mutex;
  std::set<void*> seen;
  // Each grant holds its chunk briefly, then gives it back; a grant may run
  // on the thread of another's give, so the hold is counted where it runs.
  std::function<void(absl::StatusOr<void*>)> on_grant = [&](absl::StatusOr<void*> chunk) {
    if (!chunk.ok()) {
      ++errors;
      return;
    }
    const int now = ++held;
    int prev = most.load();
    while (now > prev && !most.compare_exchange_weak(prev, now)) {
    }
    {
      std::lock_guard lock(seen_mutex);
      seen.insert(*chunk);
    }
    ++granted;
    --held;
    pool.give(*chunk);
  };
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) pool.take(on_grant);
    });
  }
  for (std::thread& w : workers) w.join();
  CHECK(errors == 0);
  CHECK(granted == threads * per_thread);
  CHECK(most <= count);
  CHECK(seen.size() <= static_cast<std::size_t>(count));
  CHECK(*in_use == 0);
}

}  // namespace dlasync::detail
