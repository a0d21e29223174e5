// Example support: latency percentiles and overlap accounting.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

namespace dlasync::examples {

using clock = std::chrono::steady_clock;

// Collects durations from any thread; percentiles over all of them.
class latency_recorder {
 public:
  void add(clock::duration d) {
    std::lock_guard lock(mutex_);
    samples_.push_back(std::chrono::duration<double, std::micro>(d).count());
  }

  std::size_t count() const {
    std::lock_guard lock(mutex_);
    return samples_.size();
  }

  // The p-th percentile (0-100) in microseconds; 0 without samples.
  double percentile_us(double p) const {
    std::lock_guard lock(mutex_);
    if (samples_.empty()) return 0;
    std::vector<double> sorted = samples_;
    const auto rank =
        static_cast<std::size_t>(std::lround(p / 100.0 * static_cast<double>(sorted.size() - 1)));
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(rank),
                     sorted.end());
    return sorted[rank];
  }

 private:
  mutable std::mutex mutex_;
  std::vector<double> samples_;
};

// Records [start, end) intervals of work (imports) and tells how much of the
// summed work time ran while at least one other interval was also open.
class overlap_meter {
 public:
  void add(clock::time_point start, clock::time_point end) {
    std::lock_guard lock(mutex_);
    intervals_.emplace_back(start, end);
  }

  // The fraction (0-1) of the summed interval time during which two or more
  // intervals were open.
  double overlapped_fraction() const {
    std::vector<std::pair<clock::time_point, int>> edges;
    {
      std::lock_guard lock(mutex_);
      for (const auto& [s, e] : intervals_) {
        edges.emplace_back(s, +1);
        edges.emplace_back(e, -1);
      }
    }
    std::sort(edges.begin(), edges.end());
    double total = 0;
    double overlapped = 0;
    int open = 0;
    for (std::size_t i = 0; i + 1 < edges.size(); ++i) {
      open += edges[i].second;
      const double span =
          std::chrono::duration<double>(edges[i + 1].first - edges[i].first).count();
      total += open * span;
      if (open >= 2) overlapped += open * span;
    }
    return total > 0 ? overlapped / total : 0;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<clock::time_point, clock::time_point>> intervals_;
};

}  // namespace dlasync::examples
