// Host benchmarks: the cost of a zero-copy import, and the bandwidth of
// strided-to-row-major copies, each paired with a baseline timed
// interleaved with it (paired.hpp). After the benchmarks it prints tables of
// per-repetition ratio medians, with the lowest and highest of each.
//
//   dlasync_bench_host [google benchmark flags]
//   DLASYNC_BENCH_MAX_BYTES=N  largest copy size (default 64 MiB)
//
// Copies are measured two ways, both against memcpy of the same bytes on
// one thread into a warm destination: the copy kernel alone on one thread
// into a warm destination, and whole imports through the runtime with its
// worker pool, awaited by a coroutine (allocation is charged to us). The
// kernel is an internal of the library: its rows are measured in builds in
// the tree (DLASYNC_BENCH_INTERNALS), not against an installed package,
// which exposes only whole imports.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/io_context.hpp"
#include "asio/post.hpp"
#include "asio/thread_pool.hpp"
#include "asio/use_awaitable.hpp"
#include "concurrent.hpp"
#include "dlasync/dlasync.hpp"
#include "layouts.hpp"
#include "paired.hpp"
#if defined(DLASYNC_BENCH_INTERNALS)
#include "transfer/src/kernels/strided_copy.hpp"
#endif

namespace {

using dlasync::bench::copy_bytes;
using dlasync::bench::host_source;
using dlasync::bench::layout;
using dlasync::bench::make_layout;
using dlasync::bench::pair_clock;
using dlasync::bench::pair_reporter;
using dlasync::bench::ratio_table;

constexpr int workers = 2;

dlasync::runtime& bench_runtime() {
  static std::unique_ptr<dlasync::runtime> rt = [] {
    dlasync::runtime_options o;
    o.topology = dlasync::process_topology::single_process(2);
    o.worker_threads = workers;
    if (const char* text = std::getenv("DLASYNC_BENCH_INLINE_COPY_BYTES")) {
      o.inline_copy_bytes = static_cast<std::uint64_t>(std::atoll(text));
    }
    if (const char* text = std::getenv("DLASYNC_BENCH_HELPER_LINGER_US")) {
      o.copy_helper_linger = std::chrono::microseconds(std::atoll(text));
    }
    return *dlasync::runtime::create(o);
  }();
  return *rt;
}

std::int64_t max_bytes() {
  const char* text = std::getenv("DLASYNC_BENCH_MAX_BYTES");
  return text != nullptr ? std::atoll(text) : std::int64_t{64} << 20;
}

// The zero-copy import alone, inline: a time, not a ratio (bench_torch
// pairs it with at::fromDLPack; scripts/count_instructions.sh counts it).
void fast_path_inline(benchmark::State& state) {
  host_source t(64, 64);
  const dlasync::device_registry& registry = bench_runtime().registry();
  for (auto _ : state) {
    dlasync::managed_tensor source(&t.managed);
    absl::StatusOr<dlasync::tensor> view = dlasync::import_view(source, {}, registry);
    benchmark::DoNotOptimize(view);
  }
  dlasync::bench::mark_unpaired(state);
}
BENCHMARK(fast_path_inline);

// Imports that bump the runtime's counters (import_view with the runtime)
// while another thread reads runtime::stats() without pause, against the
// same imports while that thread reads as many atomics of its own: both
// halves share the cores alike, and only reading the counters differs.
void fast_path_stats_reader(benchmark::State& state) {
  constexpr std::int64_t batch = 256;
  host_source t(64, 64);
  dlasync::runtime& rt = bench_runtime();
  std::atomic<bool> reading{false};
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    // As many cache lines as the counters take.
    struct alignas(64) line {
      std::atomic<std::uint64_t> value{0};
    };
    static line own[48];
    while (!stop.load(std::memory_order_relaxed)) {
      if (reading.load(std::memory_order_relaxed)) {
        const dlasync::runtime_stats s = rt.stats();
        benchmark::DoNotOptimize(s);
      } else {
        std::uint64_t sum = 0;
        for (line& l : own) sum += l.value.load(std::memory_order_acquire);
        benchmark::DoNotOptimize(sum);
      }
    }
  });
  pair_clock clock(state, batch);
  auto view = [&] {
    dlasync::managed_tensor source(&t.managed);
    absl::StatusOr<dlasync::tensor> v = dlasync::import_view(rt, source);
    benchmark::DoNotOptimize(v);
  };
  for (auto _ : state) {
    for (int half = 0; half < 2; ++half) {
      const bool base = clock.baseline_turn(half);
      reading.store(!base, std::memory_order_relaxed);
      clock.start();
      for (std::int64_t i = 0; i < batch; ++i) view();
      clock.stop(base);
    }
  }
  stop = true;
  reader.join();
  clock.finish(0);
}
BENCHMARK(fast_path_stats_reader)->UseManualTime();

// co_await import_dlpack of a zero-copy view against a bare co_await
// asio::post on the same io_context, 256 of each per half.
void fast_path_co_await(benchmark::State& state) {
  constexpr std::int64_t batch = 256;
  host_source t(64, 64);
  dlasync::runtime& rt = bench_runtime();
  asio::io_context io;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        pair_clock clock(state, batch);
        for (auto _ : state) {
          for (int half = 0; half < 2; ++half) {
            const bool base = clock.baseline_turn(half);
            clock.start();
            for (std::int64_t i = 0; i < batch; ++i) {
              if (base) {
                co_await asio::post(asio::use_awaitable);
              } else {
                dlasync::managed_tensor source(&t.managed);
                absl::StatusOr<dlasync::tensor> view = co_await dlasync::import_dlpack(rt, source);
                benchmark::DoNotOptimize(view);
              }
            }
            clock.stop(base);
          }
        }
        clock.finish(0);
      },
      asio::detached);
  io.run();
}
BENCHMARK(fast_path_co_await)->UseManualTime();

// Small imports from many concurrent coroutines: `coroutines` coroutines on
// the runtime's executor each import 16x16 float32 tensors (1 KiB) with a
// copy, one after the other. The baseline is the round trip such a copy
// makes at least: the same coroutines each hop to the worker pool and back.
constexpr int coroutines = 64;
constexpr int imports_per_coroutine = 64;

void small_imports_concurrent(benchmark::State& state) {
  static asio::thread_pool pool(workers);
  dlasync::runtime& rt = bench_runtime();
  auto imports = [&rt](int) -> asio::awaitable<void> {
    host_source t(16, 16);
    dlasync::import_options o;
    o.copy = true;
    for (int i = 0; i < imports_per_coroutine; ++i) {
      dlasync::managed_tensor source(&t.managed);
      absl::StatusOr<dlasync::tensor> copy = co_await dlasync::import_dlpack(rt, source, o);
      benchmark::DoNotOptimize(copy);
    }
  };
  auto hops = [](int) -> asio::awaitable<void> {
    for (int i = 0; i < imports_per_coroutine; ++i) {
      // To the pool, and back to the coroutine's executor to resume.
      co_await asio::post(pool, asio::use_awaitable);
    }
  };
  dlasync::bench::run_pair(
      state, 1, [&] { dlasync::bench::run_concurrently(rt, coroutines, hops); },
      [&] { dlasync::bench::run_concurrently(rt, coroutines, imports); });
}
BENCHMARK(small_imports_concurrent)->UseManualTime();

void memcpy_base(const float* src, char* dst, std::int64_t bytes) {
  std::memcpy(dst, src, static_cast<std::size_t>(bytes));
}

#if defined(DLASYNC_BENCH_INTERNALS)
// The copy kernel on this thread against memcpy of the same bytes.
void kernel_copy(benchmark::State& state, const std::string& kind) {
  const layout l = make_layout(kind, state.range(0));
  const std::int64_t bytes = copy_bytes(l);
  const float* src = dlasync::bench::ones_for(l);
  dlasync::strided_copy copy(
      {4, {l.shape.begin(), l.shape.end()}, {l.strides.begin(), l.strides.end()}});
  char* dst = dlasync::bench::scratch(copy.bytes());
  dlasync::bench::run_pair(
      state, dlasync::bench::batch_for(bytes), [&] { memcpy_base(src, dst, bytes); },
      [&] { copy.run(src + l.first, dst, 0, copy.units()); }, static_cast<double>(bytes));
}
#endif

// The floor under the rows layout: a plain loop of memcpy over the same runs
// (what any implementation must do) against memcpy of the same bytes in
// one piece. Where the kernel stays below memcpy on rows, this shows how
// much of that the access pattern itself costs.
void runs_loop(benchmark::State& state) {
  const layout l = make_layout("rows", state.range(0));
  const std::int64_t bytes = copy_bytes(l);
  const float* src = dlasync::bench::ones(static_cast<std::size_t>(l.buffer));
  char* dst = dlasync::bench::scratch(static_cast<std::size_t>(bytes));
  const std::int64_t rows = l.shape[0];
  const auto run = static_cast<std::size_t>(l.shape[1] * 4);
  const std::int64_t stride = l.strides[0];
  dlasync::bench::run_pair(
      state, dlasync::bench::batch_for(bytes), [&] { memcpy_base(src, dst, bytes); },
      [&] {
        for (std::int64_t r = 0; r < rows; ++r) {
          std::memcpy(dst + r * static_cast<std::int64_t>(run), src + r * stride, run);
        }
      },
      static_cast<double>(bytes));
}

void import_copy(benchmark::State& state, const std::string& kind) {
  dlasync::bench::import_copies_paired(state, bench_runtime(), kind, memcpy_base);
}

const char* const layouts[] = {"rows", "transpose2d", "transpose3d", "broadcast", "reversed"};

std::vector<std::int64_t> sizes() {
  std::vector<std::int64_t> out;
  for (std::int64_t b = 4 << 10; b <= max_bytes(); b *= 16) out.push_back(b);
  if (out.empty() || out.back() < max_bytes()) out.push_back(max_bytes());  // 1 GiB: 4x 256 MiB
  return out;
}

void register_copies() {
  for (std::int64_t b : sizes()) {
    for (const char* kind : layouts) {
      if (std::string(kind) == "rows") {
        benchmark::RegisterBenchmark("runs_loop", runs_loop)->Arg(b)->UseManualTime();
      }
#if defined(DLASYNC_BENCH_INTERNALS)
      benchmark::RegisterBenchmark(absl::StrCat("kernel/", kind).c_str(), kernel_copy, kind)
          ->Arg(b)
          ->UseManualTime();
#endif
      benchmark::RegisterBenchmark(absl::StrCat("import/", kind).c_str(), import_copy, kind)
          ->Arg(b)
          ->UseManualTime();
    }
  }
}

void print_ratios(const pair_reporter& r) {
  std::printf("\nratio table\n");
  std::printf("import_view (inline, 64x64 float32): %.1f ns (median; not a ratio)\n",
              r.time_ns("fast_path_inline"));
  {
    ratio_table t("host", "co_await import_dlpack (zero-copy) against a bare co_await asio::post",
                  "post", "import", "ns");
    t.row("time ratio (at most 1.3)", 0,
          r.pair("fast_path_co_await", pair_reporter::ratio_kind::cost),
          r.skipped("fast_path_co_await"));
  }
  {
    ratio_table t("host",
                  "import_view(runtime) while another thread reads runtime::stats() nonstop, "
                  "against reading its own atomics",
                  "own", "stats", "ns");
    t.row("time ratio (about 1)", 0,
          r.pair("fast_path_stats_reader", pair_reporter::ratio_kind::cost),
          r.skipped("fast_path_stats_reader"));
  }
  {
    ratio_table t("host", "1 KiB copy imports from 64 coroutines against hops to a pool and back",
                  "hops", "imports", "ns");
    t.row("imports per hop (speed)", 1024, r.pair("small_imports_concurrent"),
          r.skipped("small_imports_concurrent"));
  }
#if defined(DLASYNC_BENCH_INTERNALS)
  {
    ratio_table t("host", "copy kernel, 1 thread, against memcpy of the same bytes", "memcpy",
                  "kernel");
    for (std::int64_t b : sizes()) {
      for (const char* kind : layouts) {
        const std::string name = absl::StrCat("kernel/", kind, "/", b);
        t.row(kind, copy_bytes(make_layout(kind, b)), r.pair(name), r.skipped(name));
      }
    }
  }
#endif
  {
    ratio_table t("host", "rows: a plain loop of memcpy over the same 1 KiB runs (the floor)",
                  "memcpy", "loop");
    for (std::int64_t b : sizes()) {
      const std::string name = absl::StrCat("runs_loop/", b);
      t.row("rows", copy_bytes(make_layout("rows", b)), r.pair(name), r.skipped(name));
    }
  }
  {
    ratio_table t("host",
                  absl::StrCat("whole copy import, ", workers,
                               " workers, against memcpy of the same bytes on 1 thread"),
                  "memcpy", "import");
    for (std::int64_t b : sizes()) {
      for (const char* kind : layouts) {
        const std::string name = absl::StrCat("import/", kind, "/", b);
        t.row(kind, copy_bytes(make_layout(kind, b)), r.pair(name), r.skipped(name));
      }
    }
  }
}

// --count=NAME: runs operation NAME `calls` times inside count_calls and
// nothing else, for an instruction count that noise does not move
// (scripts/count_instructions.sh runs it under callgrind, collecting inside
// count_calls only). One untimed call first warms caches and pools.
constexpr int calls = 1000;

[[gnu::noinline]] void count_calls(const std::function<void()>& op, int times = calls) {
  for (int i = 0; i < times; ++i) op();
}

int count(const std::string& name) {
  dlasync::runtime& rt = bench_runtime();
  host_source view_source(64, 64);
  const dlasync::device_registry& registry = rt.registry();
  std::function<void()> op;
  if (name == "import_view") {
    op = [&] {
      dlasync::managed_tensor source(&view_source.managed);
      absl::StatusOr<dlasync::tensor> view = dlasync::import_view(source, {}, registry);
      benchmark::DoNotOptimize(view);
    };
  } else if (name == "stats") {
    op = [&] {
      const dlasync::runtime_stats s = rt.stats();
      benchmark::DoNotOptimize(s);
    };
  } else if (name == "co_await_import" || name == "co_await_post" || name == "co_await_copy_64k") {
    // As the timed pair runs them: one coroutine on an io_context of this
    // thread awaits `calls` operations in a loop; the io_context runs inside
    // count_calls, so a post's trip through the scheduler is counted too.
    host_source copy_source(64, 256);  // 64 KiB
    dlasync::import_options copy;
    copy.copy = true;
    const int which = name == "co_await_post" ? 0 : name == "co_await_import" ? 1 : 2;
    asio::io_context io;
    auto loop = [&](int n) -> asio::awaitable<void> {
      for (int i = 0; i < n; ++i) {
        if (which == 0) {
          co_await asio::post(asio::use_awaitable);
        } else if (which == 1) {
          dlasync::managed_tensor source(&view_source.managed);
          absl::StatusOr<dlasync::tensor> v = co_await dlasync::import_dlpack(rt, source);
          benchmark::DoNotOptimize(v);
        } else {
          dlasync::managed_tensor source(&copy_source.managed);
          absl::StatusOr<dlasync::tensor> c = co_await dlasync::import_dlpack(rt, source, copy);
          benchmark::DoNotOptimize(c);
        }
      }
    };
    // The untimed warm-up call, then the counted ones.
    asio::co_spawn(io, loop(1), asio::detached);
    io.run();
    io.restart();
    asio::co_spawn(io, loop(calls), asio::detached);
    count_calls([&] { io.run(); }, 1);
    return 0;
  } else {
    std::fprintf(stderr, "unknown --count operation: %s\n", name.c_str());
    return 2;
  }
  op();
  count_calls(op);
  return 0;
}

}  // namespace

// NOLINTNEXTLINE(bugprone-exception-escape): what escapes main ends the program with its message
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--count=", 0) == 0) return count(arg.substr(8));
  }
  dlasync::bench::initialize_with_repetitions(argc, argv);
  register_copies();
  pair_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  print_ratios(reporter);
  benchmark::Shutdown();
  return 0;
}
