// Host benchmarks: the cost of a zero-copy import, and the bandwidth of
// strided-to-row-major copies, each against a baseline measured in the same
// run. After the benchmarks it prints a table of ratios of medians.
//
//   dlasync_bench_host [google benchmark flags]
//   DLASYNC_BENCH_MAX_BYTES=N  largest copy size (default 64 MiB)
//
// Copies are measured two ways: the copy kernel alone on one thread into a
// warm destination (against memcpy of the same bytes), and whole imports
// through the runtime with its worker pool, awaited by a coroutine (against
// the faster of memcpy on one thread and memcpy split over as many threads,
// into a warm destination, so allocation is charged to us). The kernel is
// an internal of the library: its rows are measured in builds in the tree
// (DLASYNC_BENCH_INTERNALS), not against an installed package, which
// exposes only whole imports.
#include <benchmark/benchmark.h>

#include "concurrent.hpp"
#include "layouts.hpp"
#include "median_reporter.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/io_context.hpp"
#include "asio/post.hpp"
#include "asio/thread_pool.hpp"
#include "asio/use_awaitable.hpp"
#include "asio/use_future.hpp"
#include "dlasync/dlasync.hpp"
#if defined(DLASYNC_BENCH_INTERNALS)
#include "transfer/src/copy/strided_copy.hpp"
#endif

namespace {

using dlasync::bench::copy_bytes;
using dlasync::bench::host_source;
using dlasync::bench::layout;
using dlasync::bench::make_layout;
using dlasync::bench::run_concurrently;

constexpr int workers = 2;

dlasync::runtime& bench_runtime() {
  static std::unique_ptr<dlasync::runtime> rt = [] {
    dlasync::runtime_options o;
    o.topology = dlasync::process_topology::single_process(2);
    o.worker_threads = workers;
    return *dlasync::runtime::create(o);
  }();
  return *rt;
}

std::int64_t max_bytes() {
  const char* text = std::getenv("DLASYNC_BENCH_MAX_BYTES");
  return text != nullptr ? std::atoll(text) : std::int64_t{64} << 20;
}

void fast_path_inline(benchmark::State& state) {
  host_source t(64, 64);
  const dlasync::device_registry& registry = bench_runtime().registry();
  for (auto _ : state) {
    dlasync::managed_tensor source(&t.managed);
    absl::StatusOr<dlasync::tensor> view = dlasync::import_view(source, {}, registry);
    benchmark::DoNotOptimize(view);
  }
}
BENCHMARK(fast_path_inline);

void fast_path_co_await(benchmark::State& state) {
  host_source t(64, 64);
  dlasync::runtime& rt = bench_runtime();
  asio::io_context io;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (auto _ : state) {
          dlasync::managed_tensor source(&t.managed);
          absl::StatusOr<dlasync::tensor> view = co_await dlasync::import_dlpack(rt, source);
          benchmark::DoNotOptimize(view);
        }
      },
      asio::detached);
  io.run();
}
BENCHMARK(fast_path_co_await);

void baseline_co_await_post(benchmark::State& state) {
  asio::io_context io;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (auto _ : state) co_await asio::post(asio::use_awaitable);
      },
      asio::detached);
  io.run();
}
BENCHMARK(baseline_co_await_post);

// Small imports from many concurrent coroutines: `coroutines` coroutines on
// the runtime's executor each import 16x16 float32 tensors (1 KiB) with a
// copy, one after the other; items per second is imports per second. The
// baseline is the round trip such a copy makes at least: the same
// coroutines each hop to the worker pool and back.
constexpr int coroutines = 64;
constexpr int imports_per_coroutine = 64;

void small_imports_concurrent(benchmark::State& state) {
  dlasync::runtime& rt = bench_runtime();
  run_concurrently(
      state, rt, coroutines, imports_per_coroutine, [&rt](int) -> asio::awaitable<void> {
        host_source t(16, 16);
        dlasync::import_options o;
        o.copy = true;
        for (int i = 0; i < imports_per_coroutine; ++i) {
          dlasync::managed_tensor source(&t.managed);
          absl::StatusOr<dlasync::tensor> copy = co_await dlasync::import_dlpack(rt, source, o);
          benchmark::DoNotOptimize(copy);
        }
      });
}
BENCHMARK(small_imports_concurrent)->UseRealTime();

void baseline_pool_round_trips(benchmark::State& state) {
  static asio::thread_pool pool(workers);
  run_concurrently(state, bench_runtime(), coroutines, imports_per_coroutine,
                   [](int) -> asio::awaitable<void> {
                     for (int i = 0; i < imports_per_coroutine; ++i) {
                       // To the pool, and back to the coroutine's executor to resume.
                       co_await asio::post(pool, asio::use_awaitable);
                     }
                   });
}
BENCHMARK(baseline_pool_round_trips)->UseRealTime();

#if defined(DLASYNC_BENCH_INTERNALS)
void kernel_copy(benchmark::State& state, const std::string& kind) {
  const layout l = make_layout(kind, state.range(0));
  const float* src = dlasync::bench::ones(static_cast<std::size_t>(l.buffer));
  dlasync::strided_copy copy(
      {4, {l.shape.begin(), l.shape.end()}, {l.strides.begin(), l.strides.end()}});
  char* dst = dlasync::bench::scratch(copy.bytes());
  for (auto _ : state) {
    copy.run(src + l.first, dst, 0, copy.units());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * copy_bytes(l));
}
#endif

void baseline_memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const float* src = dlasync::bench::ones(bytes / 4 + 1);
  char* dst = dlasync::bench::scratch(bytes);
  for (auto _ : state) {
    std::memcpy(dst, src, bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void import_copy(benchmark::State& state, const std::string& kind) {
  dlasync::bench::import_copies(state, bench_runtime(), kind);
}

// memcpy split over `workers` threads: this thread and the pool's others,
// as a parallel loop would.
void baseline_memcpy_threads(benchmark::State& state) {
  static asio::thread_pool pool(workers - 1);
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const char* src = reinterpret_cast<const char*>(dlasync::bench::ones(bytes / 4 + 1));
  char* dst = dlasync::bench::scratch(bytes);
  auto part = [&](int p) {
    const std::size_t begin = bytes * p / workers;
    const std::size_t end = bytes * (p + 1) / workers;
    std::memcpy(dst + begin, src + begin, end - begin);
  };
  for (auto _ : state) {
    std::vector<std::future<void>> parts;
    for (int p = 1; p < workers; ++p) {
      parts.push_back(asio::post(pool, asio::use_future([&part, p] { part(p); })));
    }
    part(0);
    for (auto& f : parts) f.get();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
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
    benchmark::RegisterBenchmark("memcpy", baseline_memcpy)->Arg(b);
    benchmark::RegisterBenchmark("memcpy_threads", baseline_memcpy_threads)->Arg(b)->UseRealTime();
    for (const char* kind : layouts) {
#if defined(DLASYNC_BENCH_INTERNALS)
      benchmark::RegisterBenchmark(absl::StrCat("kernel/", kind).c_str(), kernel_copy, kind)
          ->Arg(b);
#endif
      benchmark::RegisterBenchmark(absl::StrCat("import/", kind).c_str(), import_copy, kind)
          ->Arg(b)
          ->UseRealTime();
    }
  }
}

// Keeps the median (or the only run) of each benchmark's real time, in ns.

void print_ratios(const dlasync::bench::median_reporter& r) {
  auto get = [&](const std::string& name) { return r.ns(name); };
  std::printf("\nratio table (medians of this run)\n");
  const double inline_ns = get("fast_path_inline");
  const double await_ns = get("fast_path_co_await");
  const double post_ns = get("baseline_co_await_post");
  std::printf("%-34s %10s %10s %8s\n", "fast path", "ns", "base ns", "ratio");
  std::printf("%-34s %10.1f %10s %8s\n", "import_view (inline)", inline_ns, "-", "-");
  if (post_ns > 0) {
    std::printf("%-34s %10.1f %10.1f %8.2f\n", "co_await import vs co_await post", await_ns,
                post_ns, await_ns / post_ns);
  }
  const double small_ns = get("small_imports_concurrent/real_time");
  const double hops_ns = get("baseline_pool_round_trips/real_time");
  if (small_ns > 0 && hops_ns > 0) {
    const double per_round = coroutines * imports_per_coroutine;
    std::printf("%-34s %10.0f %10.0f %8.2f\n", "small copies/s, 64 coroutines",
                per_round * 1e9 / small_ns, per_round * 1e9 / hops_ns, hops_ns / small_ns);
  }
  std::printf("\n%-34s %10s %10s %8s\n", "copy (bandwidth ratio to memcpy)", "bytes", "GB/s",
              "ratio");
  for (std::int64_t b : sizes()) {
    const std::string arg = absl::StrCat("/", b);
    const double memcpy_ns = get(absl::StrCat("memcpy", arg));
    const double memcpy_mt_ns = get(absl::StrCat("memcpy_threads", arg, "/real_time"));
    for (const char* kind : layouts) {
      const double kernel_ns = get(absl::StrCat("kernel/", kind, arg));
      const double import_ns = get(absl::StrCat("import/", kind, arg, "/real_time"));
      const double bytes = static_cast<double>(copy_bytes(make_layout(kind, b)));
      if (kernel_ns > 0 && memcpy_ns > 0) {
        std::printf("%-34s %10lld %10.2f %8.2f\n", absl::StrCat("kernel 1 thread ", kind).c_str(),
                    static_cast<long long>(b), bytes / kernel_ns,
                    (bytes / kernel_ns) / (static_cast<double>(b) / memcpy_ns));
      }
      // Against the faster memcpy of this size: one thread, or split over
      // the threads (which pays a hop to the pool first).
      const double best_ns = memcpy_mt_ns > 0 && memcpy_ns > 0 ? std::min(memcpy_ns, memcpy_mt_ns)
                                                               : std::max(memcpy_ns, memcpy_mt_ns);
      if (import_ns > 0 && best_ns > 0) {
        std::printf("%-34s %10lld %10.2f %8.2f\n",
                    absl::StrCat("import ", workers, " workers ", kind).c_str(),
                    static_cast<long long>(b), bytes / import_ns,
                    (bytes / import_ns) / (static_cast<double>(b) / best_ns));
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  dlasync::bench::initialize_with_medians(argc, argv);
  register_copies();
  dlasync::bench::median_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  print_ratios(reporter);
  benchmark::Shutdown();
  return 0;
}
