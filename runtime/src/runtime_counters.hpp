// The runtime's import counters (internal): what runtime::stats() reads.
// The transfer layer counts each import twice, when it begins and when it
// completes (once, when it completes inside its call), and the bytes of
// each completed copy on its path; the staging chunks and the budget's
// waiters are counted by the chunk pool and the budget themselves.
//
// Every thread that starts or completes imports bumps these, so each
// counter has a cache line of its own: without that, the workers' and the
// callers' increments would pull one line back and forth between cores.
// Increments are relaxed, but for the completion counts, which release:
// a reader that acquires them sees the begin (and the outcome) of every
// import they count, so the snapshot's sums never contradict each other
// (dlasync/runtime_stats.hpp).
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "dlasync/runtime.hpp"

namespace dlasync::detail {

// How an import completed.
enum class import_outcome : std::uint8_t { view, copy, failed };

// The transfer paths that move bytes, one counter each, as the fields of
// transfer_bytes; transfer/src/copy/transfer_path.hpp maps its paths on
// them.
enum class byte_path : std::uint8_t {
  host_to_host,
  pinned_to_gpu,
  pageable_to_gpu,
  gpu_to_host,
  within_gpu,
  gpu_to_gpu,
};
inline constexpr std::size_t byte_path_count = 6;

class runtime_counters {
 public:
  using clock = std::chrono::steady_clock;

  // An import begins. Its latency is not timed yet: an import that
  // completes inside the call without copying (a view, a refusal) counts in
  // the first bucket, under 1 us, without reading the clock, as two clock
  // reads would cost about as much as such an import. One that copies or
  // waits is timed from then on (timed_from).
  void import_began() noexcept { began_.value.fetch_add(1, std::memory_order_relaxed); }

  // An import that began and completed inside one call without copying or
  // waiting (a view, a refusal): one increment, where import_began and
  // import_completed take three (a locked instruction each on x86; the
  // three were about a sixth of a zero-copy co_await import). It counts as
  // begun, as completed with `outcome` (view or failed), and in the first
  // latency bucket.
  void import_instant(import_outcome outcome) noexcept {
    instant_[outcome == import_outcome::view ? 0 : 1].value.fetch_add(1, std::memory_order_release);
  }

  // `began`, or now when the import is not timed yet.
  static clock::time_point timed_from(clock::time_point began) noexcept {
    return began == clock::time_point{} ? clock::now() : began;
  }

  // The import begun at `began` (clock::time_point{}: not timed, see
  // import_began) completed with `outcome`.
  void import_completed(clock::time_point began, import_outcome outcome) noexcept {
    std::size_t bucket = 0;
    if (began != clock::time_point{}) {
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - began);
      const auto ticks = static_cast<std::uint64_t>(us.count() > 0 ? us.count() : 0);
      bucket = std::min<std::size_t>(std::bit_width(ticks), latency_histogram::bucket_count - 1);
    }
    // The outcome first: a reader that sees the bucket sees it too.
    outcomes_[static_cast<std::size_t>(outcome)].value.fetch_add(1, std::memory_order_release);
    buckets_[bucket].value.fetch_add(1, std::memory_order_release);
  }

  // A copy on `path` completed, having moved `bytes`.
  void moved(byte_path path, std::uint64_t bytes) noexcept {
    bytes_[static_cast<std::size_t>(path)].value.fetch_add(bytes, std::memory_order_relaxed);
  }

  // The import counters of `stats` (runtime_stats documents the order of
  // the reads and what it promises).
  void read(runtime_stats& stats) const noexcept;

 private:
  // 64 bytes: the cache line of x86-64 and of most Arm cores. (g++ warns
  // that std::hardware_destructive_interference_size may differ between
  // translation units compiled for other targets.)
  struct alignas(64) counter {
    std::atomic<std::uint64_t> value{0};
  };

  counter began_;
  std::array<counter, 2> instant_;  // views, failures
  std::array<counter, 3> outcomes_;
  std::array<counter, byte_path_count> bytes_;
  std::array<counter, latency_histogram::bucket_count> buckets_;
};

}  // namespace dlasync::detail
