// dlasync against PyTorch's own C++ importer and compaction, on the same
// tensors in the same run (built only when libtorch is installed):
//   - a zero-copy import of a legacy 64x64 float32 DLManagedTensor:
//     dlasync::import_view against at::fromDLPack;
//   - strided-to-row-major copies of the layouts of bench_host (row slices,
//     2-D and 3-D transposes, broadcast, reversed rows): a whole dlasync
//     import (allocation included) against at::Tensor::contiguous() on a
//     view of the same memory, with 1 thread each and with 2 threads each
//     (dlasync's workers, ATen's intra-op threads).
// Every ratio is paired: the two sides are timed interleaved, and the table
// prints the median of the per-repetition ratios with the lowest and
// highest (paired.hpp).
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
#include "paired.hpp"

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
    if (const char* text = std::getenv("DLASYNC_BENCH_INLINE_COPY_BYTES")) {
      o.inline_copy_bytes = static_cast<std::uint64_t>(std::atoll(text));
    }
    if (const char* text = std::getenv("DLASYNC_BENCH_HELPER_LINGER_US")) {
      o.copy_helper_linger = std::chrono::microseconds(std::atoll(text));
    }
    if (const char* text = std::getenv("DLASYNC_BENCH_PARALLEL_COPY_BYTES")) {
      o.parallel_copy_bytes = static_cast<std::uint64_t>(std::atoll(text));
    }
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

// import_view against at::fromDLPack, 256 of each per half.
void views(benchmark::State& state) {
  small_tensor t;
  const dlasync::device_registry& registry = bench_runtime(2).registry();
  dlasync::bench::run_pair(
      state, 256,
      [&] {
        at::Tensor view = at::fromDLPack(&t.managed);
        benchmark::DoNotOptimize(view);
      },
      [&] {
        dlasync::managed_tensor source(&t.managed);
        absl::StatusOr<dlasync::tensor> view = dlasync::import_view(source, {}, registry);
        benchmark::DoNotOptimize(view);
      });
}
BENCHMARK(views)->UseManualTime();

// A whole dlasync copy import against contiguous() on a view of the same
// memory, with `threads` threads each.
void copies(benchmark::State& state, const std::string& kind, int threads) {
  const layout l = make_layout(kind, state.range(0));
  at::set_num_threads(threads);
  // PyTorch does not accept negative strides (from_blob and fromDLPack
  // refuse them): such layouts are reported, not run.
  for (std::int64_t stride : l.strides) {
    if (stride < 0) {
      state.SkipWithError("refused: PyTorch does not accept negative strides");
      return;
    }
  }
  // Grown here to what import_copies_paired asks for, so that the view
  // below does not point into a buffer moved by a later growth.
  float* src = const_cast<float*>(dlasync::bench::ones_for(l));
  const at::Tensor view =
      at::from_blob(src + l.first, l.shape, l.strides, at::TensorOptions().dtype(at::kFloat));
  dlasync::bench::import_copies_paired(state, bench_runtime(threads), kind,
                                       [&](const float*, char*, std::int64_t) {
                                         at::Tensor compact = view.contiguous();
                                         benchmark::DoNotOptimize(compact.data_ptr());
                                       });
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
    for (const char* kind : layouts) {
      for (int threads : thread_counts) {
        benchmark::RegisterBenchmark(absl::StrCat("copy/", kind, "/t", threads).c_str(), copies,
                                     kind, threads)
            ->Arg(b)
            ->UseManualTime();
      }
    }
  }
}

void print_ratios(const dlasync::bench::pair_reporter& r) {
  using dlasync::bench::ratio_table;
  std::printf("\ntorch ratio table\n");
  {
    ratio_table t("torch", "zero-copy import: import_view against at::fromDLPack", "torch",
                  "dlasync", "ns");
    t.row("time ratio (at most 0.5)", 0,
          r.pair("views", dlasync::bench::pair_reporter::ratio_kind::cost), r.skipped("views"));
  }
  for (int threads : thread_counts) {
    ratio_table t("torch",
                  absl::StrCat("whole copy import against contiguous(), ", threads,
                               threads == 1 ? " thread" : " threads", " each (at least 1.0)"),
                  "torch");
    for (std::int64_t b : sizes()) {
      for (const char* kind : layouts) {
        const std::string name = absl::StrCat("copy/", kind, "/t", threads, "/", b);
        t.row(kind, copy_bytes(make_layout(kind, b)), r.pair(name), r.skipped(name));
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  dlasync::bench::initialize_with_repetitions(argc, argv);
  register_copies();
  dlasync::bench::pair_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  print_ratios(reporter);
  benchmark::Shutdown();
  return 0;
}
