// Paired benchmarks: a baseline and the code measured against it, timed
// interleaved, so that a ratio compares the two at the same moments on the
// same warm buffers. On a shared machine a baseline measured at another
// moment than the code it divides is not a ratio to trust.
//
// Each iteration times `batch` runs of one arm, then `batch` of the other,
// alternating which goes first. A Google Benchmark repetition gives one
// ratio: the baseline's time over the measured code's, over the same
// iterations. The tables print the median of those per-repetition ratios,
// with the lowest and the highest, beside each arm's own rate (so a wrong
// baseline shows), and mark a ratio "unstable" when its highest is over 1.5
// times its lowest (the rule of bench/python/bench_python.py).
//
//   void kernel_vs_memcpy(benchmark::State& state) {
//     dlasync::bench::run_pair(state, batch, [&] { memcpy(...); }, [&] { copy.run(...); },
//                              bytes);
//   }
//   benchmark::RegisterBenchmark("kernel/rows/4096", kernel_vs_memcpy)->UseManualTime();
//   ...
//   dlasync::bench::pair_reporter reporter;
//   benchmark::RunSpecifiedBenchmarks(&reporter);
//   dlasync::bench::ratio_table table("host", "copy kernel against memcpy", "memcpy");
//   table.row("rows", 4096, reporter.pair("kernel/rows/4096"));
//
// DLASYNC_BENCH_RATIOS=FILE appends every table row to FILE as CSV (the
// plot of scripts/bench.sh reads it): program, title, label, bytes, unit,
// baseline's figure, measured figure, ratio, lowest, highest, repetitions,
// unstable (1 or 0).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dlasync::bench {

// The clock of one paired benchmark, for loops that cannot be a lambda
// (coroutines that co_await in both arms):
//
//   pair_clock clock(state, batch);
//   for (auto _ : state) {
//     for (int half = 0; half < 2; ++half) {
//       const bool base = clock.baseline_turn(half);
//       clock.start();
//       for (std::int64_t i = 0; i < batch; ++i) base ? ... : co_await ...;
//       clock.stop(base);
//     }
//   }
//   clock.finish(bytes);
class pair_clock {
 public:
  pair_clock(benchmark::State& state, std::int64_t batch) : state_(state), batch_(batch) {}

  // Whether the baseline runs in half `half` (0 or 1) of this iteration:
  // first on even iterations, second on odd ones.
  bool baseline_turn(int half) const noexcept { return (half == 0) == even_; }

  void start() noexcept { t0_ = std::chrono::steady_clock::now(); }

  // Ends the timing of one arm; after the measured arm, its time is the
  // iteration's (benchmarks registered with UseManualTime).
  void stop(bool baseline) {
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0_).count();
    if (baseline) {
      base_ns_ += ns;
    } else {
      ns_ += ns;
      state_.SetIterationTime(ns * 1e-9);
    }
    if (++halves_ % 2 == 0) even_ = !even_;
  }

  // Records this repetition: each arm's time per run, and the bytes one run
  // moves (0 for operations that move none).
  void finish(double bytes) {
    const double runs = static_cast<double>(state_.iterations() * batch_);
    if (runs <= 0) return;
    state_.counters["base_ns"] = base_ns_ / runs;
    state_.counters["ns"] = ns_ / runs;
    state_.counters["batch"] = static_cast<double>(batch_);
    if (bytes > 0) state_.SetBytesProcessed(static_cast<std::int64_t>(runs * bytes));
    state_.counters["run_bytes"] = bytes;
  }

 private:
  benchmark::State& state_;
  std::int64_t batch_;
  std::chrono::steady_clock::time_point t0_{};
  double base_ns_ = 0;
  double ns_ = 0;
  std::int64_t halves_ = 0;
  bool even_ = true;
};

// A pair of plain callables: `base` and `measured`, `batch` times each per
// iteration, interleaved; `bytes` is what one run moves.
template <typename Base, typename Measured>
void run_pair(benchmark::State& state, std::int64_t batch, Base&& base, Measured&& measured,
              double bytes = 0) {
  pair_clock clock(state, batch);
  for (auto _ : state) {
    for (int half = 0; half < 2; ++half) {
      const bool b = clock.baseline_turn(half);
      clock.start();
      if (b) {
        for (std::int64_t i = 0; i < batch; ++i) base();
      } else {
        for (std::int64_t i = 0; i < batch; ++i) measured();
      }
      benchmark::ClobberMemory();
      clock.stop(b);
    }
  }
  clock.finish(bytes);
}

// For a benchmark that is not a pair, in a program whose pairs write CSV:
// Google Benchmark's CSV writer wants every run to carry the counters of
// the first, so such a benchmark carries the pair counters at 0 (the
// reporter reads them as "not a pair").
inline void mark_unpaired(benchmark::State& state) {
  for (const char* name : {"base_ns", "ns", "batch", "run_bytes"}) state.counters[name] = 0;
}

// Enough runs per half that one half lasts tens of microseconds, so the
// clock's own cost stays out of the figures: for operations of `bytes`.
inline std::int64_t batch_for(std::int64_t bytes) {
  constexpr std::int64_t target = std::int64_t{1} << 20;
  return std::clamp<std::int64_t>(target / std::max<std::int64_t>(bytes, 1), 1, 256);
}

// What the repetitions of one pair gave.
struct pair_summary {
  int reps = 0;        // repetitions seen; 0 when the pair did not run
  double base_ns = 0;  // the baseline's time per run, median over repetitions
  double ns = 0;       // the measured code's
  double bytes = 0;    // bytes one run moves
  double ratio = 0;    // median of the per-repetition ratios
  double low = 0;      // the lowest and highest of them
  double high = 0;
  bool unstable() const noexcept { return reps > 1 && high > 1.5 * low; }
};

// Keeps every repetition of every paired benchmark, and prints only the
// aggregates on the console.
class pair_reporter : public benchmark::ConsoleReporter {
 public:
  enum class ratio_kind {
    speed,  // baseline time / measured time: above 1, the measured code is faster
    cost,   // measured time / baseline time: below 1, the measured code is cheaper
  };

  // The repetitions of `name` (as registered, without "/manual_time").
  pair_summary pair(const std::string& name, ratio_kind kind = ratio_kind::speed) const {
    pair_summary out;
    auto it = reps_.find(name);
    if (it == reps_.end() || it->second.empty()) return out;
    std::vector<double> ratios, base, ns;
    for (const rep& r : it->second) {
      if (r.ns <= 0 || r.base_ns <= 0) continue;
      ratios.push_back(kind == ratio_kind::speed ? r.base_ns / r.ns : r.ns / r.base_ns);
      base.push_back(r.base_ns);
      ns.push_back(r.ns);
      out.bytes = r.bytes;
    }
    if (ratios.empty()) return out;
    out.reps = static_cast<int>(ratios.size());
    out.ratio = median(ratios);
    out.low = *std::min_element(ratios.begin(), ratios.end());
    out.high = *std::max_element(ratios.begin(), ratios.end());
    out.base_ns = median(base);
    out.ns = median(ns);
    return out;
  }

  // The median real time in ns of an unpaired benchmark's repetitions; 0
  // when it did not run.
  double time_ns(const std::string& name) const {
    auto it = times_.find(name);
    return it == times_.end() || it->second.empty() ? 0.0 : median(it->second);
  }

  // Why a pair did not run (its error), or "".
  std::string skipped(const std::string& name) const {
    auto it = errors_.find(name);
    return it == errors_.end() ? std::string() : it->second;
  }

  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> shown;
    for (const Run& run : runs) {
      std::string name = run.benchmark_name();
      for (const char* suffix : {"/manual_time", "/real_time"}) {
        const std::size_t at = name.rfind(suffix);
        if (at != std::string::npos) name.erase(at);
      }
      if (run.run_type == Run::RT_Aggregate) {
        shown.push_back(run);
        continue;
      }
      if (run.error_occurred) {
        errors_[name] = run.error_message;
        shown.push_back(run);
        continue;
      }
      if (run.repetitions <= 1) shown.push_back(run);
      auto base = run.counters.find("base_ns");
      auto ns = run.counters.find("ns");
      auto bytes = run.counters.find("run_bytes");
      if (base == run.counters.end() || ns == run.counters.end() || base->second.value <= 0) {
        times_[name].push_back(run.GetAdjustedRealTime());
        continue;
      }
      reps_[name].push_back({base->second.value, ns->second.value,
                             bytes == run.counters.end() ? 0.0 : bytes->second.value});
    }
    if (!shown.empty()) ConsoleReporter::ReportRuns(shown);
  }

 private:
  struct rep {
    double base_ns;
    double ns;
    double bytes;
  };

  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }

  std::map<std::string, std::vector<rep>> reps_;
  std::map<std::string, std::vector<double>> times_;
  std::map<std::string, std::string> errors_;
};

// Initializes Google Benchmark with 9 repetitions by default (9 ratios a
// pair); flags on the command line win.
inline void initialize_with_repetitions(int argc, char** argv) {
  static std::string reps = "--benchmark_repetitions=9";
  std::vector<char*> args{argv[0], reps.data()};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
}

// One table of ratios: a title (the question it answers), the baseline's
// name, and rows of a label, a size and a pair's summary. Rates are GB/s
// where the pair moves bytes, else times in ns.
class ratio_table {
 public:
  // `unit` is "GB/s" (rates of pairs that move bytes) or "ns" (time per run).
  ratio_table(std::string program, std::string title, std::string baseline,
              std::string measured = "dlasync", std::string unit = "GB/s")
      : program_(std::move(program)),
        title_(std::move(title)),
        baseline_(std::move(baseline)),
        measured_(std::move(measured)),
        unit_(std::move(unit)) {
    std::printf("\n%s (%s = 1; median of interleaved per-repetition ratios [lowest-highest])\n",
                title_.c_str(), baseline_.c_str());
    std::printf("%-30s %11s %14s %14s %7s %15s\n", "", "bytes", base_col().c_str(),
                own_col().c_str(), "ratio", "[low-high]");
  }

  void row(const std::string& label, std::int64_t bytes, const pair_summary& s,
           const std::string& skipped = "") {
    if (s.reps == 0) {
      std::printf("%-30s %11lld %s\n", label.c_str(), static_cast<long long>(bytes),
                  skipped.empty() ? "did not run" : skipped.c_str());
      return;
    }
    const bool rates = unit_ == "GB/s" && s.bytes > 0;
    auto fig = [&](double ns) { return rates ? s.bytes / ns : ns; };
    std::printf("%-30s %11lld %14.2f %14.2f %7.2f   [%.2f-%.2f]%s\n", label.c_str(),
                static_cast<long long>(bytes), fig(s.base_ns), fig(s.ns), s.ratio, s.low, s.high,
                s.unstable() ? " unstable" : "");
    if (const char* path = std::getenv("DLASYNC_BENCH_RATIOS")) {
      if (std::FILE* f = std::fopen(path, "a")) {
        std::fprintf(f, "%s,\"%s\",\"%s\",%lld,%s,%.6g,%.6g,%.4f,%.4f,%.4f,%d,%d\n",
                     program_.c_str(), title_.c_str(), label.c_str(), static_cast<long long>(bytes),
                     rates ? "GB/s" : "ns", fig(s.base_ns), fig(s.ns), s.ratio, s.low, s.high,
                     s.reps, s.unstable() ? 1 : 0);
        std::fclose(f);
      }
    }
  }

 private:
  std::string base_col() const { return baseline_.substr(0, 9) + " " + unit_; }
  std::string own_col() const { return measured_.substr(0, 9) + " " + unit_; }

  std::string program_;
  std::string title_;
  std::string baseline_;
  std::string measured_;
  std::string unit_;
};

}  // namespace dlasync::bench
