// GPU benchmarks: imports against cudaMemcpyAsync, each pair timed
// interleaved (paired.hpp); the tables print the median of the
// per-repetition ratios with the lowest and highest.
//
//   dlasync_bench_gpu [google benchmark flags]
//   DLASYNC_CUDA=real (default) or sim:N   which CUDA runtime
//   DLASYNC_BENCH_MAX_BYTES=N              largest transfer (default 1 GiB)
//
// Host-to-device: a pageable host tensor imported onto cuda:0 (dlasync's
// staging pipeline) against cudaMemcpyAsync from pinned memory and from
// pageable memory. Device-to-host likewise. Device-to-device: a copy=true
// import and a strided (transposed) compaction against cudaMemcpyAsync.
// Completion latency: a view that follows an idle producer stream, from the
// call to the resumed coroutine (event record, reactor, resume), p50/p99.
// Small imports: 64 coroutines each import 1 KiB host tensors onto cuda:0,
// one after the other, against one thread doing 1 KiB pageable
// cudaMemcpyAsync calls each followed by a wait (imports or copies per second).
// Slow deleters (two GPUs or more): 64 KiB pageable imports onto cuda:1,
// alone and while another import's deleter on cuda:0 blocks for 50 ms,
// interleaved round by round; p50 and max of each.
#include <benchmark/benchmark.h>

#include "concurrent.hpp"
#include "paired.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/io_context.hpp"
#include "asio/use_future.hpp"
#include "dlasync/dlasync.hpp"

namespace {

const dlasync::device gpu0{dlasync::device_kind::cuda, 0};
const dlasync::device pinned_host{dlasync::device_kind::cuda_host, 0};

dlasync::runtime* rt = nullptr;

std::int64_t max_bytes() {
  const char* text = std::getenv("DLASYNC_BENCH_MAX_BYTES");
  return text != nullptr ? std::atoll(text) : std::int64_t{1} << 30;
}

// Memory of `d` (cuda:0, or pinned host memory) for the benchmarks.
dlasync::device_buffer allocate(dlasync::device d, std::size_t n) {
  absl::StatusOr<dlasync::device_buffer> b = rt->allocate(d, n);
  if (!b.ok()) {
    std::fprintf(stderr, "allocation failed: %s\n", b.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(b);
}

dlasync::gpu_stream new_stream() {
  absl::StatusOr<dlasync::gpu_stream> s = dlasync::gpu_stream::create(*rt, gpu0);
  if (!s.ok()) {
    std::fprintf(stderr, "stream creation failed: %s\n", s.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(s);
}

struct device_block {
  dlasync::device_buffer memory;
  void* data;
  explicit device_block(std::size_t n) : memory(allocate(gpu0, n)), data(memory.data()) {}
};

DLManagedTensorVersioned describe(void* data, dlasync::device d, std::int64_t* shape,
                                  std::int64_t* strides, int ndim) {
  DLManagedTensorVersioned m{};
  m.version = {1, 3};
  m.dl_tensor.data = data;
  m.dl_tensor.device = dlasync::to_dl_device(d);
  m.dl_tensor.ndim = ndim;
  m.dl_tensor.dtype = dlasync::dtypes::float32.to_dl();
  m.dl_tensor.shape = shape;
  m.dl_tensor.strides = strides;
  return m;
}

// One import, waited for.
absl::Status import_once(DLManagedTensorVersioned& m, const dlasync::import_options& o) {
  dlasync::managed_tensor source(&m);
  return dlasync::async_import_dlpack(*rt, source, o, asio::use_future).get().status();
}

// One cudaMemcpyAsync on stream `s`, waited for on the host.
bool memcpy_once(dlasync::gpu_stream& s, void* dst, const void* src, std::int64_t n) {
  return s.copy_async(dst, src, static_cast<std::size_t>(n)).ok() && s.synchronize().ok();
}

// A pair: `base` (cudaMemcpyAsync from `src` to `dst`, waited for) against
// an import of `m` with `o`, one of each per half, after one untimed run of
// each: the memory both use (pools, caches, pages) is in its steady state.
void import_against_memcpy(benchmark::State& state, DLManagedTensorVersioned& m,
                           const dlasync::import_options& o, void* dst, const void* src,
                           std::int64_t memcpy_bytes, std::int64_t bytes) {
  dlasync::gpu_stream s = new_stream();
  if (absl::Status warm = import_once(m, o); !warm.ok()) {
    state.SkipWithError(std::string(warm.message()).c_str());
    return;
  }
  if (!memcpy_once(s, dst, src, memcpy_bytes)) {
    state.SkipWithError("cudaMemcpyAsync failed");
    return;
  }
  bool failed = false;
  dlasync::bench::run_pair(
      state, 1, [&] { failed |= !memcpy_once(s, dst, src, memcpy_bytes); },
      [&] { failed |= !import_once(m, o).ok(); }, static_cast<double>(bytes));
  if (failed) state.SkipWithError("a copy or an import failed");
}

// Host to device: a pageable host tensor imported onto cuda:0 (the staging
// pipeline) against cudaMemcpyAsync of the same bytes from pinned memory
// (`pinned`) or from the same pageable memory.
void h2d(benchmark::State& state, bool pinned) {
  const std::int64_t n = state.range(0);
  std::vector<char> host(static_cast<std::size_t>(n), 1);
  std::int64_t shape[1] = {n / 4};
  DLManagedTensorVersioned m = describe(host.data(), dlasync::host_device, shape, nullptr, 1);
  dlasync::import_options o;
  o.target = gpu0;
  device_block d(static_cast<std::size_t>(n));
  if (pinned) {
    dlasync::device_buffer staging = allocate(pinned_host, static_cast<std::size_t>(n));
    std::memset(staging.data(), 1, static_cast<std::size_t>(n));
    import_against_memcpy(state, m, o, d.data, staging.data(), n, n);
  } else {
    import_against_memcpy(state, m, o, d.data, host.data(), n, n);
  }
}

// Device to host: cuda:0 memory imported to the host against
// cudaMemcpyAsync into pinned or pageable memory.
void d2h(benchmark::State& state, bool pinned) {
  const std::int64_t n = state.range(0);
  device_block d(static_cast<std::size_t>(n));
  std::int64_t shape[1] = {n / 4};
  DLManagedTensorVersioned m = describe(d.data, gpu0, shape, nullptr, 1);
  dlasync::import_options o;
  o.target = dlasync::host_device;
  if (pinned) {
    dlasync::device_buffer to = allocate(pinned_host, static_cast<std::size_t>(n));
    import_against_memcpy(state, m, o, to.data(), d.data, n, n);
  } else {
    std::vector<char> to(static_cast<std::size_t>(n));
    import_against_memcpy(state, m, o, to.data(), d.data, n, n);
  }
}

// Device to device: a copy=true import of a compact tensor, or the
// compaction of its transpose, against a device-to-device cudaMemcpyAsync
// of the same bytes.
void d2d(benchmark::State& state, bool transposed) {
  const std::int64_t n = state.range(0);
  device_block d(static_cast<std::size_t>(n));
  device_block other(static_cast<std::size_t>(n));
  std::int64_t side = 1;
  while ((side * 2) * (side * 2) * 4 <= n) side *= 2;
  std::int64_t shape[2] = {side, side};
  std::int64_t strides[2] = {1, side};
  DLManagedTensorVersioned m = describe(d.data, gpu0, shape, transposed ? strides : nullptr, 2);
  dlasync::import_options o;
  o.copy = true;
  o.require_contiguous = true;
  const std::int64_t bytes = side * side * 4;
  import_against_memcpy(state, m, o, other.data, d.data, bytes, bytes);
}

// Small host-to-device imports from many coroutines on the runtime's
// executor, each importing 1 KiB tensors (16x16 float32) one after the
// other, against one thread doing the same number of 1 KiB pageable
// cudaMemcpyAsync calls, each waited for, as a framework's synchronous copy
// does.
constexpr int small_coroutines = 64;
constexpr int small_imports_each = 16;

void small_h2d(benchmark::State& state) {
  std::vector<std::vector<float>> hosts(small_coroutines, std::vector<float>(256, 1.0f));
  std::int64_t shape[2] = {16, 16};
  dlasync::import_options o;
  o.target = gpu0;
  std::atomic<bool> failed{false};
  auto imports = [&](int c) -> asio::awaitable<void> {
    for (int i = 0; i < small_imports_each; ++i) {
      DLManagedTensorVersioned m =
          describe(hosts[c].data(), dlasync::host_device, shape, nullptr, 2);
      dlasync::managed_tensor source(&m);
      absl::StatusOr<dlasync::tensor> t = co_await dlasync::import_dlpack(*rt, source, o);
      if (!t.ok()) failed = true;
    }
  };
  std::vector<float> host(256, 1.0f);
  device_block d(1024);
  dlasync::gpu_stream s = new_stream();
  dlasync::bench::run_pair(
      state, 1,
      [&] {
        for (int i = 0; i < small_coroutines * small_imports_each; ++i) {
          failed = failed || !memcpy_once(s, d.data, host.data(), 1024);
        }
      },
      [&] { dlasync::bench::run_concurrently(*rt, small_coroutines, imports); });
  if (failed) state.SkipWithError("a small import or copy failed");
}

// Completion latency, p50 and p99, printed after the table.
std::vector<double> latencies_us;

void measure_latency() {
  device_block d(4096);
  std::int64_t shape[1] = {1024};
  DLManagedTensorVersioned m = describe(d.data, {dlasync::device_kind::cuda, 0}, shape, nullptr, 1);
  dlasync::gpu_stream producer = new_stream();
  dlasync::import_options o;
  o.stream = producer.dlpack_stream();
  asio::io_context io;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 2000; ++i) {
          dlasync::managed_tensor source(&m);
          const auto t0 = std::chrono::steady_clock::now();
          absl::StatusOr<dlasync::tensor> t = co_await dlasync::import_dlpack(*rt, source, o);
          const auto t1 = std::chrono::steady_clock::now();
          if (t.ok())
            latencies_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
      },
      asio::detached);
  io.run();
}

struct deleter_latencies {
  std::vector<double> alone_ms;
  std::vector<double> beside_ms;
};

deleter_latencies measure_slow_deleters() {
  deleter_latencies out;
  const dlasync::served_devices* gpus = rt->registry().find(dlasync::device_kind::cuda);
  if (gpus == nullptr || gpus->count < 2) return out;
  std::vector<float> host(std::size_t{16} * 1024, 1.0f);
  auto source = [&](absl::AnyInvocable<void() &&> on_delete) {
    dlasync::tensor_description d;
    d.data = host.data();
    d.shape = {static_cast<std::int64_t>(host.size())};
    return dlasync::make_managed_tensor(std::move(d), std::move(on_delete));
  };
  dlasync::import_options to_gpu1;
  to_gpu1.target = dlasync::device{dlasync::device_kind::cuda, 1};
  dlasync::import_options to_gpu0;
  to_gpu0.target = gpu0;
  auto timed_import = [&] {
    dlasync::managed_tensor s = source(nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<dlasync::tensor> t =
        dlasync::async_import_dlpack(*rt, s, to_gpu1, asio::use_future).get();
    const auto t1 = std::chrono::steady_clock::now();
    return t.ok() ? std::chrono::duration<double, std::milli>(t1 - t0).count() : -1.0;
  };
  for (int round = 0; round < 20; ++round) {
    if (const double ms = timed_import(); ms >= 0) out.alone_ms.push_back(ms);
    std::atomic<bool> deleting{false};
    dlasync::managed_tensor slow = source([&] {
      deleting = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    });
    std::future<absl::StatusOr<dlasync::tensor>> stalled =
        dlasync::async_import_dlpack(*rt, slow, to_gpu0, asio::use_future);
    while (!deleting) std::this_thread::yield();
    if (const double ms = timed_import(); ms >= 0) out.beside_ms.push_back(ms);
    (void)stalled.get();
  }
  return out;
}

std::vector<std::int64_t> sizes() {
  std::vector<std::int64_t> out;
  for (std::int64_t b = 4 << 20; b <= max_bytes(); b *= 4) out.push_back(b);
  if (out.empty()) out.push_back(max_bytes());
  return out;
}

// The simulated link's rate, GB/s each way (DLASYNC_SIM_LINK_GBPS, default
// 2): slow enough for this host's memcpy, so that the link is the bound.
double sim_link_gbps() {
  const char* text = std::getenv("DLASYNC_SIM_LINK_GBPS");
  const double gbps = text != nullptr ? std::atof(text) : 0.0;
  return gbps > 0 ? gbps : 2.0;
}

}  // namespace

// NOLINTNEXTLINE(bugprone-exception-escape): what escapes main ends the program with its message
int main(int argc, char** argv) {
  dlasync::runtime_options o;
  o.topology = dlasync::process_topology::single_process();
  const char* mode = std::getenv("DLASYNC_CUDA");
  o.cuda = mode != nullptr ? mode : "real";
  // A simulated GPU gets a known link: host-device rates are reported
  // against bytes / link rate, the best the simulated link allows.
  o.simulation.host_to_device_gbps = sim_link_gbps();
  o.simulation.device_to_host_gbps = sim_link_gbps();
  o.simulation.memory_per_device = std::uint64_t{4} << 30;
  o.simulation.device_reuse_bytes = std::uint64_t{2} << 30;
  absl::StatusOr<std::unique_ptr<dlasync::runtime>> created = dlasync::runtime::create(o);
  if (!created.ok() || (*created)->registry().find(dlasync::device_kind::cuda) == nullptr) {
    std::printf("skipped: the GPU benchmarks need a CUDA device (or DLASYNC_CUDA=sim:N): %s\n",
                created.ok() ? "no CUDA backend" : std::string(created.status().message()).c_str());
    return 0;
  }
  rt = created->get();
  dlasync::bench::initialize_with_repetitions(argc, argv);
  for (std::int64_t b : sizes()) {
    benchmark::RegisterBenchmark("h2d/pinned", h2d, true)->Arg(b)->UseManualTime();
    benchmark::RegisterBenchmark("h2d/pageable", h2d, false)->Arg(b)->UseManualTime();
    benchmark::RegisterBenchmark("d2h/pinned", d2h, true)->Arg(b)->UseManualTime();
    benchmark::RegisterBenchmark("d2h/pageable", d2h, false)->Arg(b)->UseManualTime();
    benchmark::RegisterBenchmark("d2d/copy", d2d, false)->Arg(b)->UseManualTime();
    benchmark::RegisterBenchmark("d2d/transposed", d2d, true)->Arg(b)->UseManualTime();
  }
  benchmark::RegisterBenchmark("small/h2d", small_h2d)->UseManualTime();
  dlasync::bench::pair_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  measure_latency();
  deleter_latencies deleters = measure_slow_deleters();
  benchmark::Shutdown();

  const bool simulated = rt->is_simulated(gpu0);
  const std::string kind = simulated ? "SIMULATED GPU: " : "GPU: ";
  std::printf("\nGPU ratio table (%s)\n", simulated ? "SIMULATED GPU" : "real GPU");
  if (simulated) {
    std::printf(
        "simulated link %.2f GB/s each way: the rates are the simulation's, and say nothing of a "
        "real GPU; an import's GB/s over the link rate is its share of the bound\n",
        sim_link_gbps());
  }
  struct question {
    const char* name;
    const char* title;
    const char* baseline;
  };
  const question questions[] = {
      {"h2d/pinned",
       "host to device: pageable import against pinned cudaMemcpyAsync (at least 0.9 "
       "from 64 MiB)",
       "pinned"},
      {"h2d/pageable",
       "host to device: pageable import against pageable cudaMemcpyAsync (at "
       "least 3 from 64 MiB)",
       "pageable"},
      {"d2h/pinned", "device to host: import against cudaMemcpyAsync into pinned memory", "pinned"},
      {"d2h/pageable", "device to host: import against cudaMemcpyAsync into pageable memory",
       "pageable"},
      {"d2d/copy", "device to device: copy import against cudaMemcpyAsync", "d2d copy"},
      {"d2d/transposed",
       "device to device: transposed compaction against cudaMemcpyAsync of the "
       "same bytes (at least 0.7)",
       "d2d copy"},
  };
  for (const question& q : questions) {
    dlasync::bench::ratio_table t("gpu", kind + q.title, q.baseline, "import");
    for (std::int64_t b : sizes()) {
      const std::string name = absl::StrCat(q.name, "/", b);
      const dlasync::bench::pair_summary p = reporter.pair(name);
      t.row(q.name, b, p, reporter.skipped(name));
      if (simulated && p.reps > 0 && std::string(q.name).rfind("d2d", 0) != 0 && p.ns > 0) {
        std::printf("%-30s %11s import at %.2f of the simulated link\n", "", "",
                    p.bytes / p.ns / sim_link_gbps());
      }
    }
  }
  {
    dlasync::bench::ratio_table t(
        "gpu", kind + "1 KiB host-to-device imports from 64 coroutines against synchronous copies",
        "sync", "imports", "ns");
    t.row("imports per copy (speed)", 1024, reporter.pair("small/h2d"),
          reporter.skipped("small/h2d"));
  }
  if (!latencies_us.empty()) {
    std::sort(latencies_us.begin(), latencies_us.end());
    std::printf("completion latency (stream-following view): p50 %.1f us, p99 %.1f us\n",
                latencies_us[latencies_us.size() / 2],
                latencies_us[latencies_us.size() * 99 / 100]);
  }
  if (!deleters.alone_ms.empty() && !deleters.beside_ms.empty()) {
    auto p50 = [](std::vector<double>& v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double alone = p50(deleters.alone_ms);
    const double beside = p50(deleters.beside_ms);
    std::printf(
        "64 KiB imports onto cuda:1, alone p50 %.3f ms (max %.3f), beside a 50 ms deleter on "
        "cuda:0 p50 %.3f ms (max %.3f): %.2f\n",
        alone, deleters.alone_ms.back(), beside, deleters.beside_ms.back(), beside / alone);
  }
  return 0;
}
