// Collects the median real time of every benchmark (or the single run's
// time when there are no repetitions), keyed by name without "_median", so
// that a program can print ratios of medians measured in the same run; and
// the default flags that ask for those medians.
#pragma once

#include <benchmark/benchmark.h>

#include <map>
#include <string>
#include <vector>

namespace dlasync::bench {

class median_reporter : public benchmark::ConsoleReporter {
 public:
  // The median real time of `name` in ns; 0 when it did not run.
  double ns(const std::string& name) const {
    auto it = ns_.find(name);
    return it == ns_.end() ? 0.0 : it->second;
  }

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const std::string name = run.benchmark_name();
      const bool median = run.aggregate_name == "median";
      if (!median && run.run_type == Run::RT_Aggregate) continue;
      const std::string key = median ? name.substr(0, name.rfind("_median")) : name;
      if (median || !ns_.count(key)) ns_[key] = run.GetAdjustedRealTime();
    }
    ConsoleReporter::ReportRuns(runs);
  }

 private:
  std::map<std::string, double> ns_;
};

// Initializes Google Benchmark with medians of 5 repetitions by default;
// flags on the command line win.
inline void initialize_with_medians(int argc, char** argv) {
  static std::string reps = "--benchmark_repetitions=5";
  static std::string only = "--benchmark_report_aggregates_only=true";
  std::vector<char*> args{argv[0], reps.data(), only.data()};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());
}

}  // namespace dlasync::bench
