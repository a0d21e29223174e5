// Cancellation and shutdown storms: thousands of imports over every path
// (host, and the CUDA backend on two simulated GPUs) are started, a random
// share of them is cancelled at random moments from another thread, and
// the runtime is destroyed at a random moment with many still in flight.
// Every import must end exactly once, with its data or with Cancelled;
// every deleter must have run exactly once by the time the runtime's
// destructor returns; the deleters free the source memory at once, so that
// a copy still reading it shows under ASan; no device or pinned memory is
// left, and nothing hangs.
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "asio/bind_cancellation_slot.hpp"
#include "asio/bind_executor.hpp"
#include "asio/cancellation_signal.hpp"
#include "asio/executor_work_guard.hpp"
#include "asio/io_context.hpp"
#include "asio/post.hpp"
#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"
#include "support/import_paths.hpp"
#include "support/runtime_fixture.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::path_case;
using testing::source_memory;

// The GPU paths and two host-only ones.
std::vector<path_case> storm_paths() {
  std::vector<path_case> all = testing::paths();
  const device cpu{device_kind::cpu, 0};
  all.push_back(
      {"pageable host copy", cpu, std::nullopt, {64, 64}, std::nullopt, false, false, true});
  all.push_back({"strided host compaction",
                 cpu,
                 std::nullopt,
                 {64, 32},
                 std::vector<std::int64_t>{1, 64},
                 false,
                 false,
                 true});
  return all;
}

struct outcome {
  std::atomic<int> calls{0};
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string problem;  // a wrong element, or the message of an unexpected status
};

struct round_totals {
  int completed = 0;
  int cancelled = 0;
  std::size_t in_flight_at_shutdown = 0;
};

round_totals storm_round(std::uint32_t seed, int imports) {
  std::mt19937 random(seed);
  const std::vector<path_case> all = storm_paths();

  cuda::sim_options so;
  // Slow links: 16 KiB takes 16 us host to device, so work piles up.
  so.host_to_device_gbps = 1.0;
  so.device_to_host_gbps = 1.0;
  so.device_to_device_gbps = 20.0;
  so.min_sleep_us = 5.0;
  testing::sim_runtime made = testing::make_sim_runtime(so, [seed](runtime_options& o) {
    o.staging_chunks = 4;
    o.staging_chunk_bytes = 4 << 10;
    // Every other round, a budget small enough that imports wait for it.
    o.copy_memory_budget = seed % 2 == 0 ? 0 : 256 << 10;
    // Every third round, small host copies run inline (the default); else
    // they take the workers, which cancellation and shutdown can interrupt.
    if (seed % 3 != 0) o.inline_copy_bytes = 0;
  });
  std::shared_ptr<cuda::sim_api> sim = std::move(made.sim);
  std::unique_ptr<runtime> rt = std::move(made.rt);
  auto unfreed = std::make_shared<testing::unfreed_memory>();

  cuda::stream_t producers[2] = {nullptr, nullptr};
  for (int d = 0; d < 2; ++d) {
    sim->set_device(d);
    REQUIRE(sim->stream_create(&producers[d], cuda::stream_flags::non_blocking) ==
            cuda::error::success);
  }
  cuda::stream_t consumer = nullptr;
  sim->set_device(0);
  REQUIRE(sim->stream_create(&consumer, cuda::stream_flags::non_blocking) == cuda::error::success);

  // Handlers and cancellations run on one thread of their own: a
  // cancellation signal is emitted where its handler's slot is cleared.
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread io_thread([&io] { io.run(); });

  std::vector<std::unique_ptr<deleter_count>> counts;
  std::vector<std::unique_ptr<outcome>> outcomes;
  std::vector<std::unique_ptr<asio::cancellation_signal>> signals;
  for (int i = 0; i < imports; ++i) {
    counts.push_back(std::make_unique<deleter_count>());
    outcomes.push_back(std::make_unique<outcome>());
    signals.push_back(std::make_unique<asio::cancellation_signal>());
  }

  // Cancels random imports already started, at random moments.
  std::atomic<int> started{0};
  std::atomic<bool> stop_cancelling{false};
  std::thread canceller([&, seed] {
    std::mt19937 r(seed * 7919u);
    while (!stop_cancelling.load()) {
      std::this_thread::sleep_for(std::chrono::microseconds(r() % 200));
      const int n = started.load(std::memory_order_acquire);
      if (n == 0) continue;
      const int victim = static_cast<int>(r() % static_cast<std::uint32_t>(n));
      asio::post(io, [&signals, victim] {
        signals[static_cast<std::size_t>(victim)]->emit(asio::cancellation_type::terminal);
      });
    }
  });

  // A random share of the imports is started before the runtime goes.
  const int launched =
      imports / 2 + static_cast<int>(random() % static_cast<std::uint32_t>(imports / 2));
  // The sources first, their stream-ordered allocations then made usable on
  // every stream with one synchronization per GPU.
  std::vector<const path_case*> picked;
  std::vector<std::shared_ptr<source_memory>> sources;
  for (int i = 0; i < launched; ++i) {
    picked.push_back(&all[random() % all.size()]);
    sources.push_back(std::make_shared<source_memory>(*sim, unfreed, *picked.back(), false));
  }
  for (int d = 0; d < 2; ++d) {
    REQUIRE(sim->set_device(d) == cuda::error::success);
    testing::synchronize(*sim, testing::legacy_stream());
  }
  int unconsumed = 0;
  for (int i = 0; i < launched; ++i) {
    const path_case& p = *picked[static_cast<std::size_t>(i)];
    std::shared_ptr<source_memory> memory = std::move(sources[static_cast<std::size_t>(i)]);
    testing::tensor_spec s;
    s.device = p.source;
    s.shape = p.shape;
    s.strides = p.strides;
    s.data = memory->data;
    counts[static_cast<std::size_t>(i)]->on_delete = [m = std::move(memory)]() mutable {
      m.reset();
    };
    managed_tensor source = testing::make_tensor(s, *counts[static_cast<std::size_t>(i)]);
    import_options io_options;
    io_options.target = p.target;
    io_options.copy = p.copy;
    io_options.require_contiguous = true;
    if (p.producer_stream) {
      io_options.stream = reinterpret_cast<std::int64_t>(producers[p.source.ordinal]);
    }
    if (p.consumer_stream) io_options.consumer_stream = reinterpret_cast<std::int64_t>(consumer);
    outcome* out = outcomes[static_cast<std::size_t>(i)].get();
    async_import_dlpack(
        *rt, source, io_options,
        asio::bind_cancellation_slot(
            signals[static_cast<std::size_t>(i)]->slot(),
            asio::bind_executor(io, [out, &p](absl::StatusOr<tensor> t) {
              out->calls.fetch_add(1);
              out->code = t.status().code();
              if (t.ok()) {
                // After an early resume the data is ready only on the
                // consumer's stream: its status is what is checked.
                if (!p.consumer_stream) out->problem = testing::mismatch(*t, p);
              } else if (t.status().code() != absl::StatusCode::kCancelled ||
                         t.status().message().find("cancelled") == std::string_view::npos) {
                out->problem = std::string(p.name) + ": " + t.status().ToString();
              }
            })));
    unconsumed += !source.empty();
    started.store(i + 1, std::memory_order_release);
  }

  // Pull the runtime down at a random moment: in odd rounds soon, with
  // most imports still in flight.
  const std::uint32_t wait_us = seed % 2 == 1 ? 2000 : 20000;
  std::this_thread::sleep_for(std::chrono::microseconds(random() % wait_us));
  round_totals totals;
  totals.in_flight_at_shutdown = rt->in_flight();
  rt.reset();

  // The destructor returned: every source has been released, once.
  int released_once = 0;
  for (int i = 0; i < launched; ++i)
    released_once += counts[static_cast<std::size_t>(i)]->calls == 1;
  CHECK(released_once == launched);
  CHECK(unconsumed == 0);

  stop_cancelling.store(true);
  canceller.join();
  guard.reset();
  io_thread.join();

  int ended_once = 0;
  for (int i = 0; i < launched; ++i) {
    const outcome& out = *outcomes[static_cast<std::size_t>(i)];
    ended_once += out.calls == 1;
    if (!out.problem.empty()) FAIL_CHECK(out.problem);
    totals.completed += out.code == absl::StatusCode::kOk;
    totals.cancelled += out.code == absl::StatusCode::kCancelled;
  }
  CHECK(ended_once == launched);
  CHECK(totals.completed + totals.cancelled == launched);

  for (int d = 0; d < 2; ++d) sim->stream_destroy(producers[d]);
  sim->stream_destroy(consumer);
  unfreed->free_all(*sim);
  // The CUDA context may go a moment after the runtime, off the thread of
  // its last callback.
  CHECK(testing::eventually([&] {
    return sim->device_bytes_in_use(0) == 0 && sim->device_bytes_in_use(1) == 0 &&
           sim->host_bytes_pinned() == 0;
  }));
  return totals;
}

TEST_CASE("cancellation and shutdown storms over every path lose nothing",
          "[cuda][import][storm]") {
  constexpr int rounds = 6;
  constexpr int imports = 5000;
  round_totals sum;
  std::size_t peak_in_flight = 0;
  for (int round = 0; round < rounds; ++round) {
    INFO("round " << round << " (seed " << 1000 + round << ")");
    const round_totals t = storm_round(static_cast<std::uint32_t>(1000 + round), imports);
    sum.completed += t.completed;
    sum.cancelled += t.cancelled;
    sum.in_flight_at_shutdown += t.in_flight_at_shutdown;
    peak_in_flight = std::max(peak_in_flight, t.in_flight_at_shutdown);
  }
  // Both ways of ending must have happened, or the storm tested nothing.
  CHECK(sum.completed > 0);
  CHECK(sum.cancelled > 0);
  CHECK(peak_in_flight >= 100);
  WARN(rounds << " rounds: " << sum.completed << " imports completed, " << sum.cancelled
              << " cancelled; " << sum.in_flight_at_shutdown
              << " in flight when the runtimes were destroyed (at most " << peak_in_flight
              << " in one round)");
}

}  // namespace
}  // namespace dlasync
