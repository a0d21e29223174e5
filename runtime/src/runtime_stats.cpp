// runtime_stats: reading the counters, and the text the examples print.
#include "dlasync/runtime.hpp"

#include "absl/strings/str_cat.h"
#include "runtime/src/runtime_counters.hpp"

namespace dlasync {
namespace detail {

void runtime_counters::read(runtime_stats& stats) const noexcept {
  // Each read acquires what the counts read after it must include: the
  // buckets before the outcomes they follow, the outcomes before the begins
  // they follow. So count <= views + copies + failed <= begun.
  // The imports that completed inside their call count in every sum alike
  // (begun, an outcome, the first bucket): read once, they keep the order.
  const std::uint64_t instant_views = instant_[0].value.load(std::memory_order_acquire);
  const std::uint64_t instant_failures = instant_[1].value.load(std::memory_order_acquire);
  stats.latency.count = 0;
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    stats.latency.buckets[k] = buckets_[k].value.load(std::memory_order_acquire);
    if (k == 0) stats.latency.buckets[k] += instant_views + instant_failures;
    stats.latency.count += stats.latency.buckets[k];
  }
  const std::uint64_t views = outcomes_[static_cast<std::size_t>(import_outcome::view)].value.load(
      std::memory_order_acquire);
  stats.copies = outcomes_[static_cast<std::size_t>(import_outcome::copy)].value.load(
      std::memory_order_acquire);
  const std::uint64_t failed =
      outcomes_[static_cast<std::size_t>(import_outcome::failed)].value.load(
          std::memory_order_acquire);
  stats.imports_in_flight =
      began_.value.load(std::memory_order_relaxed) - (views + stats.copies + failed);
  stats.views = instant_views + views;
  stats.failed = instant_failures + failed;
  auto bytes = [this](byte_path p) {
    return bytes_[static_cast<std::size_t>(p)].value.load(std::memory_order_relaxed);
  };
  stats.bytes.host_to_host = bytes(byte_path::host_to_host);
  stats.bytes.pinned_to_gpu = bytes(byte_path::pinned_to_gpu);
  stats.bytes.pageable_to_gpu = bytes(byte_path::pageable_to_gpu);
  stats.bytes.gpu_to_host = bytes(byte_path::gpu_to_host);
  stats.bytes.within_gpu = bytes(byte_path::within_gpu);
  stats.bytes.gpu_to_gpu = bytes(byte_path::gpu_to_gpu);
}

}  // namespace detail

std::string to_string(const runtime_stats& stats) {
  const transfer_bytes& b = stats.bytes;
  std::string text = absl::StrCat(
      "imports: ", stats.imports_in_flight, " in flight, ", stats.imports_waiting_for_budget,
      " waiting for budget; ", stats.views, " views, ", stats.copies, " copies, ", stats.failed,
      " failed\nbytes: host_to_host ", b.host_to_host, ", pinned_to_gpu ", b.pinned_to_gpu,
      ", pageable_to_gpu ", b.pageable_to_gpu, ", gpu_to_host ", b.gpu_to_host, ", within_gpu ",
      b.within_gpu, ", gpu_to_gpu ", b.gpu_to_gpu,
      "\nstaging chunks: ", stats.staging_chunks_in_use, " of ", stats.staging_chunks,
      " in use\nlatency (", stats.latency.count, " imports):");
  const char* separator = " ";
  for (std::size_t k = 0; k < stats.latency.buckets.size(); ++k) {
    if (stats.latency.buckets[k] == 0) continue;
    const bool last = k + 1 == stats.latency.buckets.size();
    absl::StrAppend(&text, separator, last ? ">=" : "<",
                    latency_histogram::upper_bound_us(last ? k - 1 : k), "us ",
                    stats.latency.buckets[k]);
    separator = ", ";
  }
  return text;
}

}  // namespace dlasync
