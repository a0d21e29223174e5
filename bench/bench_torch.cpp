// dlasync against PyTorch's own C++ importer and compaction, on the same
// tensors in the same run (built only when libtorch is installed):
//   - a zero-copy import of a legacy 64x64 float32 DLManagedTensor:
//     dlasync::import_view against at::fromDLPack;
//   - strided-to-row-major copies of the layouts of bench_host (row slices,
//     2-D and 3-D transposes, broadcast, reversed rows): a whole dlasync
//     import (allocation included) against at::Tensor::contiguous() on a
//     view of the same memory, with 1 thread each and with 2 threads each
//     (dlasync's workers, ATen's intra-op threads), and memcpy of the same
//     bytes as the common yardstick.
// After the benchmarks it prints a table of ratios of medians.
//
//   dlasync_bench_torch [google benchmark flags]
//   DLASYNC_BENCH_MAX_BYTES=N  largest copy size (default 64 MiB)
#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asio/use_future.hpp"
#include "dlasync/dlasync.hpp"
#include "layouts.hpp"
#include "median_reporter.hpp"

namespace {

using dlasync::bench::copy_bytes;
using dlasync::bench::layout;
using dlasync::bench::make_layout;

// A runtime with `workers` copy workers, made once per count.
dlasync::runtime& bench_runtime(int workers) {
  static std::map<int, std::unique_ptr<dlasync::runtime>> runtimes;
  auto& rt = runtimes[workers];
  if (!rt) {
    dlasync::runtime_options o;
    o.topology = dlasync::process_topology::single_process(2);
    o.worker_threads = workers;
    rt = *dlasync::runtime::create(o);
  }
  return *rt;
}

std::int64_t max_bytes() {
  const char* text = std::getenv("DLASYNC_BENCH_MAX_BYTES");
  return text != nullptr ? std::atoll(text) : std::int64_t{64} << 20;
}

void no_op_deleter(DLManagedTensor*) {}

// A legacy 64x64 float32 tensor whose deleter does nothing.
struct small_tensor {
  float data[4096] = {};
  std::int64_t shape[2] = {64, 64};
  DLManagedTensor managed{};
  small_tensor() {
    managed.dl_tensor.data = data;
    managed.dl_tensor.device = {kDLCPU, 0};
    managed.dl_tensor.ndim = 2;
    managed.dl_tensor.dtype = {kDLFloat, 32, 1};
    managed.dl_tensor.shape = shape;
    managed.deleter = &no_op_deleter;
  }
};

void view_dlasync(benchmark::State& state) {
  small_tensor t;
  const dlasync::device_registry& registry = bench_runtime(2).registry();
  for (auto _ : state) {
    dlasync::managed_tensor source(&t.managed);
    absl::StatusOr<dlasync::tensor> view = dlasync::import_view(source, {}, registry);
    benchmark::DoNotOptimize(view);
  }
}
BENCHMARK(view_dlasync);

void view_torch(benchmark::State& state) {
  small_tensor t;
  for (auto _ : state) {
    at::Tensor view = at::fromDLPack(&t.managed);
    benchmark::DoNotOptimize(view);
  }
}
BENCHMARK(view_torch);

void copy_dlasync(benchmark::State& state, const std::string& kind, int threads) {
  dlasync::bench::import_copies(state, bench_runtime(threads), kind);
}

void copy_torch(benchmark::State& state, const std::string& kind, int threads) {
  const layout l = make_layout(kind, state.range(0));
  float* src = const_cast<float*>(dlasync::bench::ones(static_cast<std::size_t>(l.buffer)));
  at::set_num_threads(threads);
  // PyTorch does not accept negative strides (from_blob and fromDLPack
  // refuse them): such layouts are reported, not run.
  for (std::int64_t stride : l.strides) {
    if (stride < 0) {
      state.SkipWithError("PyTorch does not accept negative strides");
      return;
    }
  }
  const at::Tensor view =
      at::from_blob(src + l.first, l.shape, l.strides, at::TensorOptions().dtype(at::kFloat));
  for (auto _ : state) {
    at::Tensor compact = view.contiguous();
    benchmark::DoNotOptimize(compact.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * copy_bytes(l));
}

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

const char* const layouts[] = {"rows", "transpose2d", "transpose3d", "broadcast", "reversed"};
const int thread_counts[] = {1, 2};

std::vector<std::int64_t> sizes() {
  std::vector<std::int64_t> out;
  for (std::int64_t b = 4 << 10; b <= max_bytes(); b *= 16) out.push_back(b);
  if (out.empty() || out.back() < max_bytes()) out.push_back(max_bytes());  // 1 GiB: 4x 256 MiB
  return out;
}

void register_copies() {
  for (std::int64_t b : sizes()) {
    benchmark::RegisterBenchmark("memcpy", baseline_memcpy)->Arg(b);
    for (const char* kind : layouts) {
      for (int threads : thread_counts) {
        benchmark::RegisterBenchmark(absl::StrCat("dlasync/", kind, "/t", threads).c_str(),
                                     copy_dlasync, kind, threads)
            ->Arg(b)
            ->UseRealTime();
        benchmark::RegisterBenchmark(absl::StrCat("torch/", kind, "/t", threads).c_str(),
                                     copy_torch, kind, threads)
            ->Arg(b)
            ->UseRealTime();
      }
    }
  }
}

void print_ratios(const dlasync::bench::median_reporter& r) {
  std::printf("\ntorch ratio table (medians of this run)\n");
  const double ours = r.ns("view_dlasync");
  const double theirs = r.ns("view_torch");
  std::printf("%-40s %10s %10s %8s\n", "zero-copy import", "dlasync ns", "torch ns", "ratio");
  if (theirs > 0) {
    std::printf("%-40s %10.1f %10.1f %8.2f\n", "import_view vs at::fromDLPack", ours, theirs,
                ours / theirs);
  }
  std::printf("\n%-28s %10s %8s %8s %8s %10s\n", "copy to row-major", "bytes", "threads", "dlasync",
              "torch", "vs torch");
  std::printf("%-28s %10s %8s %8s %8s %10s\n", "(bandwidth / memcpy)", "", "", "", "", "(speedup)");
  for (std::int64_t b : sizes()) {
    const double memcpy_ns = r.ns(absl::StrCat("memcpy/", b));
    for (const char* kind : layouts) {
      const double bytes = static_cast<double>(copy_bytes(make_layout(kind, b)));
      for (int threads : thread_counts) {
        const std::string suffix = absl::StrCat("/t", threads, "/", b, "/real_time");
        const double d = r.ns(absl::StrCat("dlasync/", kind, suffix));
        const double t = r.ns(absl::StrCat("torch/", kind, suffix));
        if (d <= 0 || memcpy_ns <= 0) continue;
        const double memcpy_rate = static_cast<double>(b) / memcpy_ns;
        if (t <= 0) {  // PyTorch refused the layout
          std::printf("%-28s %10lld %8d %8.2f %8s %10s\n", kind, static_cast<long long>(b), threads,
                      bytes / d / memcpy_rate, "refused", "-");
          continue;
        }
        std::printf("%-28s %10lld %8d %8.2f %8.2f %10.2f\n", kind, static_cast<long long>(b),
                    threads, bytes / d / memcpy_rate, bytes / t / memcpy_rate, t / d);
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
