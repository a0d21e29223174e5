// Test support: runtimes for tests, and a way to wait for a condition.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "asio/executor_work_guard.hpp"
#include "asio/io_context.hpp"
#include "catch2/catch.hpp"
#include "dlasync/runtime.hpp"
#include "support/sim_runtime.hpp"
#include "support/test_tensors.hpp"

namespace dlasync::testing {

// A runtime with `host_devices` host devices, two workers, one process;
// `observer`, when given, is called after each piece of a host copy;
// `inline_copy_bytes`, when given, replaces the option's default.
inline std::unique_ptr<runtime> make_runtime(
    int host_devices = 2, std::uint64_t budget = 0, std::function<void()> observer = {},
    std::optional<std::uint64_t> inline_copy_bytes = std::nullopt) {
  runtime_options o;
  o.topology = process_topology::single_process(host_devices);
  o.worker_threads = 2;
  o.copy_memory_budget = budget;
  if (inline_copy_bytes) o.inline_copy_bytes = *inline_copy_bytes;
  detail::runtime_hooks hooks;
  hooks.copy_unit_observer = std::move(observer);
  absl::StatusOr<std::unique_ptr<runtime>> rt = detail::create_runtime(std::move(o), hooks);
  REQUIRE(rt.ok());
  return *std::move(rt);
}

// A runtime on GPUs simulated as `so` says (see build_sim_runtime).
inline sim_runtime make_sim_runtime(cuda::sim_options so = {},
                                    const std::function<void(runtime_options&)>& tune = {}) {
  absl::StatusOr<sim_runtime> r = build_sim_runtime(so, tune);
  INFO("status: " << r.status().ToString());
  REQUIRE(r.ok());
  return *std::move(r);
}

// Polls `done` for up to 30 s; false when it never became true.
inline bool eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Whether the deleter that `count` counts has run `calls` times, waiting for
// it as `eventually` does: a copy's source deleter runs on the runtime's
// releaser, and may run after the import's result has arrived.
inline bool released(const deleter_count& count, int calls = 1) {
  return eventually([&] { return count.calls.load() == calls; });
}

// Calls start(n, io) for every n in [0, threads * per_thread), from
// `threads` threads at once; handlers bound to `io` run on a thread of its
// own. Returns whether `finished()` became true within 30 s; io's thread
// has stopped by then.
inline bool start_from_threads(int threads, int per_thread,
                               const std::function<void(int, asio::io_context&)>& start,
                               const std::function<bool()>& finished) {
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  std::vector<std::thread> starters;
  for (int t = 0; t < threads; ++t) {
    starters.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) start(t * per_thread + i, io);
    });
  }
  for (std::thread& s : starters) s.join();
  const bool done = eventually(finished);
  work.reset();
  runner.join();
  return done;
}

}  // namespace dlasync::testing
