// dlasync_pipeline: an asynchronous data pipeline.
//
//   producers --[queue]--> importers --[queue]--> checkers
//
// Producer threads make float32 batches in pageable, page-locked (pinned)
// and strided host memory and hand them over as DLPack tensors. A bounded
// number of importer coroutines `co_await` their import onto the target
// device; several imports are in flight at once, so transfers overlap. The
// checkers verify every element of what arrived (a GPU tensor is imported
// back to the host for that) and account the results. The queues between the
// stages are bounded: a slow stage holds the ones before it back.
//
// The run prints a live progress line and ends with a summary table and the
// runtime's own counters (runtime::stats); the exit status is 0 only when
// every batch arrived intact.
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "asio/co_spawn.hpp"
#include "asio/experimental/as_tuple.hpp"
#include "asio/experimental/concurrent_channel.hpp"
#include "asio/steady_timer.hpp"
#include "asio/thread_pool.hpp"
#include "asio/use_awaitable.hpp"
#include "asio/use_future.hpp"
#include "common/flags.hpp"
#include "common/pinned_pool.hpp"
#include "common/stats.hpp"
#include "common/target.hpp"
#include "dlasync/dlasync.hpp"

ABSL_FLAG(std::string, device, "auto",
          "Target device: auto (the first GPU when there is one, else the host), cpu, or cuda:N.");
ABSL_FLAG(int, sim_gpus, 0,
          "Use this many simulated GPUs instead of real ones (no GPU needed); the target is then "
          "cuda:0 unless --device says otherwise.");
ABSL_FLAG(double, seconds, 10, "How long the producers make batches.");
ABSL_FLAG(int, items, 0, "Stop after this many batches (0: no limit but --seconds).");
ABSL_FLAG(double, batch_mib, 4, "Size of a batch in MiB (float32 elements).");
ABSL_FLAG(std::string, mix, "pageable,pinned,strided",
          "Kinds of source memory, taken in turn: pageable, pinned (page-locked, needs a CUDA "
          "runtime, real or simulated), strided (a transposed or row-sliced view).");
ABSL_FLAG(int, producers, 2, "Producer threads.");
ABSL_FLAG(int, concurrency, 4, "Imports in flight at most (importer coroutines).");
ABSL_FLAG(int, checkers, 2, "Checker coroutines.");
ABSL_FLAG(int, queue_depth, 4, "Capacity of each queue between stages.");
ABSL_FLAG(std::string, copy, "auto",
          "The import's copy argument: auto (copy only when needed), true (always), false "
          "(never: strided or off-device sources then fail).");
ABSL_FLAG(int, memory_budget_mib, 512, "Bytes that imported copies may hold at once, in MiB.");
ABSL_FLAG(bool, progress, true, "Print a live progress line.");

namespace dlasync::examples {
namespace {

enum class source_kind { pageable, pinned, strided };
constexpr const char* kind_names[] = {"pageable", "pinned", "strided"};

// The value of element `i` (row-major order) of batch `id`: small integers,
// exact in float32, different for each batch and position.
float expected_value(std::uint64_t id, std::int64_t i) {
  const auto v = static_cast<std::uint32_t>(id * 7919 + static_cast<std::uint64_t>(i) * 31);
  return static_cast<float>(static_cast<std::int32_t>(v & 2047) - 1024);
}

struct batch {
  std::uint64_t id = 0;
  source_kind kind = source_kind::pageable;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  managed_tensor source;
  clock::time_point made;
};

struct imported {
  std::shared_ptr<batch> b;
  absl::StatusOr<tensor> result;
};

using batch_channel =
    asio::experimental::concurrent_channel<void(asio::error_code, std::shared_ptr<batch>)>;
using result_channel =
    asio::experimental::concurrent_channel<void(asio::error_code, std::shared_ptr<imported>)>;

struct kind_stats {
  std::atomic<std::uint64_t> imports{0};
  std::atomic<std::uint64_t> copies{0};
  std::atomic<std::uint64_t> bytes{0};
  latency_recorder latency;
};

struct pipeline_stats {
  kind_stats by_kind[3];
  std::atomic<std::uint64_t> made{0};
  std::atomic<std::uint64_t> checked{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> bytes_imported{0};
  overlap_meter overlap;
  std::mutex errors_mutex;
  std::vector<std::string> errors;

  void fail(std::string why) {
    failed.fetch_add(1);
    std::lock_guard lock(errors_mutex);
    if (errors.size() < 5) errors.push_back(std::move(why));
  }
};

struct config {
  device target;
  std::vector<source_kind> mix;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::optional<bool> copy;
  clock::time_point stop_at;
  std::uint64_t max_items = 0;
  int importers = 1;
  int checkers = 1;
};

// Makes one batch: a rows x cols float32 tensor in the kind of memory asked.
absl::StatusOr<std::shared_ptr<batch>> make_batch(std::uint64_t id, source_kind kind,
                                                  const config& cfg, pinned_pool* pinned) {
  auto b = std::make_shared<batch>();
  b->id = id;
  b->kind = kind;
  b->rows = cfg.rows;
  b->cols = cfg.cols;
  const std::int64_t n = cfg.rows * cfg.cols;
  const std::array<std::int64_t, 2> shape{cfg.rows, cfg.cols};
  if (kind == source_kind::strided) {
    // Odd batches are transposed (column-major); even ones take every other
    // row of a buffer twice as tall.
    const bool transposed = id % 2 == 1;
    const std::int64_t stored = transposed ? n : 2 * n;
    auto buffer = std::shared_ptr<float[]>(new float[static_cast<std::size_t>(stored)]);
    const std::array<std::int64_t, 2> strides = transposed
                                                    ? std::array<std::int64_t, 2>{1, cfg.rows}
                                                    : std::array<std::int64_t, 2>{2 * cfg.cols, 1};
    // Written in storage order: the transposed walk would miss the cache on
    // every element.
    if (transposed) {
      for (std::int64_t c = 0; c < cfg.cols; ++c) {
        for (std::int64_t r = 0; r < cfg.rows; ++r) {
          buffer[r + c * cfg.rows] = expected_value(id, r * cfg.cols + c);
        }
      }
    } else {
      for (std::int64_t r = 0; r < cfg.rows; ++r) {
        for (std::int64_t c = 0; c < cfg.cols; ++c) {
          buffer[r * 2 * cfg.cols + c] = expected_value(id, r * cfg.cols + c);
        }
      }
    }
    tensor_description d;
    d.data = buffer.get();
    d.shape.assign(shape.begin(), shape.end());
    d.strides = std::vector<std::int64_t>(strides.begin(), strides.end());
    b->source = make_managed_tensor(std::move(d), [buffer = std::move(buffer)] {});
  } else {
    std::shared_ptr<void> keep;
    float* data = nullptr;
    device where = host_device;
    if (kind == source_kind::pinned) {
      absl::StatusOr<std::shared_ptr<void>> block =
          pinned->take(static_cast<std::size_t>(n) * sizeof(float));
      if (!block.ok()) return block.status();
      data = static_cast<float*>(block->get());
      keep = *std::move(block);
      where = {device_kind::cuda_host, 0};
    } else {
      auto buffer = std::shared_ptr<float[]>(new float[static_cast<std::size_t>(n)]);
      data = buffer.get();
      keep = std::move(buffer);
    }
    for (std::int64_t i = 0; i < n; ++i) data[i] = expected_value(id, i);
    tensor_description d;
    d.data = data;
    d.device = where;
    d.shape.assign(shape.begin(), shape.end());
    b->source = make_managed_tensor(std::move(d), [keep = std::move(keep)] {});
  }
  b->made = clock::now();
  return b;
}

asio::awaitable<void> produce(int index, int producers, const config& cfg, pinned_pool* pinned,
                              batch_channel& out, pipeline_stats& stats,
                              std::atomic<int>& producers_left) {
  // Each producer takes the kinds in turn, starting at its own index.
  std::size_t turn = static_cast<std::size_t>(index);
  for (std::uint64_t id = static_cast<std::uint64_t>(index);;
       id += static_cast<std::uint64_t>(producers)) {
    if (clock::now() >= cfg.stop_at || (cfg.max_items != 0 && id >= cfg.max_items)) break;
    absl::StatusOr<std::shared_ptr<batch>> b =
        make_batch(id, cfg.mix[turn++ % cfg.mix.size()], cfg, pinned);
    stats.made.fetch_add(1);
    if (!b.ok()) {
      stats.fail(absl::StrCat("batch ", id, " could not be made: ", b.status().ToString()));
      continue;
    }
    auto [ec] = co_await out.async_send(asio::error_code{}, *std::move(b),
                                        asio::experimental::as_tuple(asio::use_awaitable));
    if (ec) break;
  }
  // The last producer tells each importer to stop, behind every batch in
  // the queue (closing the channel would drop what it still holds).
  if (producers_left.fetch_sub(1) == 1) {
    for (int i = 0; i < cfg.importers; ++i) {
      co_await out.async_send(asio::error_code{}, nullptr,
                              asio::experimental::as_tuple(asio::use_awaitable));
    }
  }
}

asio::awaitable<void> import_stage(runtime& rt, const config& cfg, batch_channel& in,
                                   result_channel& out, pipeline_stats& stats,
                                   std::atomic<int>& importers_left) {
  import_options options;
  options.target = cfg.target;
  options.copy = cfg.copy;
  options.require_contiguous = true;
  for (;;) {
    auto [ec, b] = co_await in.async_receive(asio::experimental::as_tuple(asio::use_awaitable));
    if (ec || b == nullptr) break;
    const clock::time_point start = clock::now();
    const std::uint64_t bytes = static_cast<std::uint64_t>(b->rows * b->cols) * sizeof(float);
    auto item = std::make_shared<imported>();
    item->result = co_await import_dlpack(rt, b->source, options);
    const clock::time_point end = clock::now();
    if (item->result.ok()) {
      kind_stats& k = stats.by_kind[static_cast<int>(b->kind)];
      k.imports.fetch_add(1);
      if (item->result->is_copy()) k.copies.fetch_add(1);
      k.bytes.fetch_add(bytes);
      k.latency.add(end - start);
      stats.bytes_imported.fetch_add(bytes);
      stats.overlap.add(start, end);
    }
    item->b = std::move(b);
    auto [send_ec] = co_await out.async_send(asio::error_code{}, std::move(item),
                                             asio::experimental::as_tuple(asio::use_awaitable));
    if (send_ec) break;
  }
  if (importers_left.fetch_sub(1) == 1) {
    for (int i = 0; i < cfg.checkers; ++i) {
      co_await out.async_send(asio::error_code{}, nullptr,
                              asio::experimental::as_tuple(asio::use_awaitable));
    }
  }
}

// The first element of `t` that differs from what batch `b` was made with.
std::optional<std::string> first_mismatch(const tensor& t, const batch& b) {
  const auto* data = static_cast<const float*>(t.data());
  const std::int64_t n = b.rows * b.cols;
  for (std::int64_t i = 0; i < n; ++i) {
    if (data[i] != expected_value(b.id, i)) {
      return absl::StrCat("batch ", b.id, " (", kind_names[static_cast<int>(b.kind)], "): element ",
                          i, " is ", data[i], ", expected ", expected_value(b.id, i));
    }
  }
  return std::nullopt;
}

asio::awaitable<void> check_stage(runtime& rt, result_channel& in, pipeline_stats& stats) {
  for (;;) {
    auto [ec, item] = co_await in.async_receive(asio::experimental::as_tuple(asio::use_awaitable));
    if (ec || item == nullptr) break;
    const batch& b = *item->b;
    if (!item->result.ok()) {
      stats.fail(absl::StrCat("batch ", b.id, " (", kind_names[static_cast<int>(b.kind)],
                              ") failed: ", item->result.status().ToString()));
      continue;
    }
    tensor t = *std::move(item->result);
    if (!is_host_memory(t.device().kind)) {
      // Bring it back through dlasync itself: export, import onto the host.
      absl::StatusOr<DLManagedTensorVersioned*> exported = t.to_dlpack_versioned();
      if (!exported.ok()) {
        stats.fail(exported.status().ToString());
        continue;
      }
      managed_tensor back(*exported);
      import_options options;
      options.target = host_device;
      absl::StatusOr<tensor> host = co_await import_dlpack(rt, back, options);
      if (!host.ok()) {
        stats.fail(absl::StrCat("batch ", b.id,
                                ": copy back to the host failed: ", host.status().ToString()));
        continue;
      }
      t = *std::move(host);
    }
    if (auto why = first_mismatch(t, b)) {
      stats.fail(*why);
      continue;
    }
    stats.checked.fetch_add(1);
  }
}

void print_progress(const pipeline_stats& stats, clock::time_point start, bool tty) {
  const double s = std::chrono::duration<double>(clock::now() - start).count();
  const std::uint64_t made = stats.made.load();
  const std::uint64_t done = stats.checked.load() + stats.failed.load();
  const std::string line =
      absl::StrFormat("%6.1f s  items %llu  %.2f GB/s  in flight %llu  failed %llu", s,
                      static_cast<unsigned long long>(done),
                      s > 0 ? static_cast<double>(stats.bytes_imported.load()) / s / 1e9 : 0.0,
                      static_cast<unsigned long long>(made - done),
                      static_cast<unsigned long long>(stats.failed.load()));
  std::fprintf(stderr, tty ? "\r%s   " : "%s\n", line.c_str());
}

void print_summary(const pipeline_stats& stats, const config& cfg, double seconds,
                   const std::string& device_label) {
  std::printf("\ndlasync pipeline: %s, %.2f MiB float32 batches, %.1f s\n\n", device_label.c_str(),
              static_cast<double>(cfg.rows * cfg.cols * 4) / (1 << 20), seconds);
  std::printf("| source   | imports | copies | imports/s |   GB/s | p50 ms | p99 ms |\n");
  std::printf("|----------|--------:|-------:|----------:|-------:|-------:|-------:|\n");
  std::uint64_t imports = 0;
  std::uint64_t copies = 0;
  latency_recorder all;
  for (int k = 0; k < 3; ++k) {
    const kind_stats& ks = stats.by_kind[k];
    if (ks.imports.load() == 0) continue;
    imports += ks.imports.load();
    copies += ks.copies.load();
    std::printf("| %-8s | %7llu | %6llu | %9.1f | %6.2f | %6.2f | %6.2f |\n", kind_names[k],
                static_cast<unsigned long long>(ks.imports.load()),
                static_cast<unsigned long long>(ks.copies.load()),
                static_cast<double>(ks.imports.load()) / seconds,
                static_cast<double>(ks.bytes.load()) / seconds / 1e9,
                ks.latency.percentile_us(50) / 1e3, ks.latency.percentile_us(99) / 1e3);
  }
  std::printf("| all      | %7llu | %6llu | %9.1f | %6.2f |        |        |\n",
              static_cast<unsigned long long>(imports), static_cast<unsigned long long>(copies),
              static_cast<double>(imports) / seconds,
              static_cast<double>(stats.bytes_imported.load()) / seconds / 1e9);
  std::printf(
      "\nchecked %llu of %llu batches, %llu failed; %.0f%% of the import time "
      "overlapped with other imports\n",
      static_cast<unsigned long long>(stats.checked.load()),
      static_cast<unsigned long long>(stats.made.load()),
      static_cast<unsigned long long>(stats.failed.load()),
      100 * stats.overlap.overlapped_fraction());
}

absl::StatusOr<std::vector<source_kind>> parse_mix(const std::string& text, bool have_pinned) {
  std::vector<source_kind> mix;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    if (part == "pageable") {
      mix.push_back(source_kind::pageable);
    } else if (part == "pinned") {
      if (have_pinned) mix.push_back(source_kind::pinned);
    } else if (part == "strided") {
      mix.push_back(source_kind::strided);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--mix: unknown kind \"", part, "\"; use pageable, pinned and strided"));
    }
  }
  if (mix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mix=", text, " leaves no kind of source memory",
                     have_pinned ? "" : " (pinned needs a CUDA runtime: try --sim_gpus=2)"));
  }
  return mix;
}

int run() {
  runtime_options ro;
  ro.executor_threads = 2;
  ro.copy_memory_budget = static_cast<std::uint64_t>(absl::GetFlag(FLAGS_memory_budget_mib)) << 20;
  if (absl::GetFlag(FLAGS_sim_gpus) > 0)
    ro.cuda = absl::StrCat("sim:", absl::GetFlag(FLAGS_sim_gpus));
  absl::StatusOr<std::unique_ptr<runtime>> created = runtime::create(ro);
  if (!created.ok()) {
    std::fprintf(stderr, "dlasync_pipeline: %s\n", created.status().ToString().c_str());
    return 2;
  }
  runtime& rt = **created;
  absl::StatusOr<device> target = choose_target(rt, absl::GetFlag(FLAGS_device));
  absl::StatusOr<std::optional<bool>> copy = parse_copy_flag(absl::GetFlag(FLAGS_copy));
  absl::StatusOr<std::vector<source_kind>> mix =
      parse_mix(absl::GetFlag(FLAGS_mix), rt.registry().find(device_kind::cuda) != nullptr);
  for (const absl::Status& s : {target.status(), copy.status(), mix.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "dlasync_pipeline: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  const int producers = std::max(1, absl::GetFlag(FLAGS_producers));
  const int importers = std::max(1, absl::GetFlag(FLAGS_concurrency));
  const int checkers = std::max(1, absl::GetFlag(FLAGS_checkers));
  const double batch_mib = std::max(1.0 / 1024, absl::GetFlag(FLAGS_batch_mib));

  config cfg;
  cfg.target = *target;
  cfg.mix = *mix;
  cfg.importers = importers;
  cfg.checkers = checkers;
  cfg.copy = *copy;
  cfg.cols = 1024;
  cfg.rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(batch_mib * (1 << 20) / 4 / 1024));
  cfg.max_items = static_cast<std::uint64_t>(std::max(0, absl::GetFlag(FLAGS_items)));
  const std::string label = device_label(rt, cfg.target);
  std::printf("dlasync pipeline: %d producers -> %d importers -> %d checkers onto %s\n", producers,
              importers, checkers, label.c_str());
  std::fflush(stdout);

  std::unique_ptr<pinned_pool> pinned;
  if (rt.registry().find(device_kind::cuda) != nullptr) pinned = std::make_unique<pinned_pool>(rt);
  pipeline_stats stats;
  {
    asio::thread_pool producer_threads(static_cast<std::size_t>(producers));
    batch_channel batches(rt.get_executor(),
                          static_cast<std::size_t>(absl::GetFlag(FLAGS_queue_depth)));
    result_channel results(rt.get_executor(),
                           static_cast<std::size_t>(absl::GetFlag(FLAGS_queue_depth)));
    std::atomic<int> producers_left{producers};
    std::atomic<int> importers_left{importers};
    const clock::time_point start = clock::now();
    cfg.stop_at = start + std::chrono::duration_cast<clock::duration>(
                              std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
    std::vector<std::future<void>> stages;
    stages.reserve(static_cast<std::size_t>(producers) + static_cast<std::size_t>(importers));
    for (int i = 0; i < producers; ++i) {
      stages.push_back(
          asio::co_spawn(producer_threads,
                         produce(i, producers, cfg, pinned.get(), batches, stats, producers_left),
                         asio::use_future));
    }
    for (int i = 0; i < importers; ++i) {
      stages.push_back(asio::co_spawn(
          rt.get_executor(), import_stage(rt, cfg, batches, results, stats, importers_left),
          asio::use_future));
    }
    for (int i = 0; i < checkers; ++i) {
      stages.push_back(
          asio::co_spawn(rt.get_executor(), check_stage(rt, results, stats), asio::use_future));
    }
    const bool tty = isatty(STDERR_FILENO) != 0;
    const bool progress = absl::GetFlag(FLAGS_progress);
    const auto period = tty ? std::chrono::milliseconds(250) : std::chrono::milliseconds(1000);
    for (std::future<void>& stage : stages) {
      while (stage.wait_for(period) != std::future_status::ready) {
        if (progress) print_progress(stats, start, tty);
      }
      stage.get();
    }
    if (progress) {
      print_progress(stats, start, tty);
      if (tty) std::fprintf(stderr, "\n");
    }
    print_summary(stats, cfg, std::chrono::duration<double>(clock::now() - start).count(), label);
    // The runtime's view of the same run, in the text the server prints.
    std::printf("\n%s\n", to_string(rt.stats()).c_str());
  }
  rt.shutdown();
  pinned.reset();
  for (const std::string& e : stats.errors) std::printf("error: %s\n", e.c_str());
  return stats.failed.load() == 0 && stats.checked.load() == stats.made.load() ? 0 : 1;
}

}  // namespace
}  // namespace dlasync::examples

// NOLINTNEXTLINE(bugprone-exception-escape): what escapes main ends the program with its message
int main(int argc, char** argv) {
  dlasync::examples::parse_flags(
      argc, argv,
      "Runs an asynchronous data pipeline: producers make float32 batches in pageable, pinned "
      "and strided host memory, importers co_await dlasync imports onto the target device with "
      "several in flight, checkers verify every element. Prints a progress line and a summary "
      "table.\n\n  dlasync_pipeline [--device=auto|cpu|cuda:N] [--sim_gpus=N] [--seconds=S] ...");
  return dlasync::examples::run();
}
