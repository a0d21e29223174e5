// dlasync/runtime_stats.hpp
//
// `dlasync::runtime_stats` is a snapshot of a runtime's counters, for a
// server to export: what is in flight and waiting, what completed as views,
// copies and failures, the bytes the copies moved on each transfer path, the
// staging chunks in use, and how long imports took. `runtime::stats()` takes
// it; `to_string` gives the text the examples print.
//
// Example, a metrics endpoint:
//
//   const dlasync::runtime_stats s = rt.stats();
//   export_gauge("dlasync_imports_in_flight", s.imports_in_flight);
//   export_counter("dlasync_bytes_pageable_to_gpu", s.bytes.pageable_to_gpu);
//   for (std::size_t k = 0; k < s.latency.buckets.size(); ++k)
//     export_bucket(dlasync::latency_histogram::upper_bound_us(k), s.latency.buckets[k]);
//
// What is counted: every import of a runtime that goes through
// import_dlpack, async_import_dlpack, import_view or a batch (each member
// counts as one import), from any thread, the Python module's included, and
// remote imports where they land through a local import (a GPU target).
// An import begins when its operation starts (validation included) and
// completes when its result is handed to its handler (posted to the
// handler's executor), or returned by import_view or the awaitable form;
// a batch member completes when its own result is in.
//
// Consistency. Each field is exact on its own: a counter read once, with
// every import that completed before stats() was called counted in it. The
// fields are read one after another, not atomically together, so an import
// that completes during the call may show in one field and not yet in
// another. The reads are ordered so that the sums never contradict each
// other: latency.count <= views + copies + failed (equal when nothing
// completes during the call), and imports_in_flight, the imports begun
// less those completed, never underflows. bytes and the outcome counts may
// differ by the copies completing during the call.
//
// Cost: the counters are atomics on cache lines of their own, bumped
// relaxed (the completion counts with release, which is what orders the
// reads above; on x86 the same instruction). An import that completes inside
// the call without copying (a view, a refusal) adds one atomic increment; one
// that copies or waits adds three to five. None takes a lock or allocates
// for them. An import that copies or waits also reads the clock twice; one
// that completes inside the call does not, as the two reads would cost
// about as much as the view itself. stats() takes no lock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace dlasync {

// Bytes the completed copies moved, by transfer path (docs/cuda.md
// describes the paths). A copy counts its whole size once it has
// succeeded; a failed or cancelled copy counts nothing. Views move no bytes.
struct transfer_bytes {
  std::uint64_t host_to_host = 0;     // host strided copies, the inline ones included
  std::uint64_t pinned_to_gpu = 0;    // compact page-locked memory, one copy each
  std::uint64_t pageable_to_gpu = 0;  // other host memory, through the staging chunks
  std::uint64_t gpu_to_host = 0;      // GPU or managed memory down through the staging chunks
  std::uint64_t within_gpu = 0;       // on one GPU (the gather kernel when strided)
  std::uint64_t gpu_to_gpu = 0;       // to another GPU (peer copies)
};

// Completion latencies of imports, in log2 buckets of microseconds.
struct latency_histogram {
  static constexpr std::size_t bucket_count = 32;

  // The exclusive upper bound of bucket k, in microseconds: buckets[0]
  // counts imports under 1 us, buckets[k] those of at least 2^(k-1) and
  // under 2^k us; the last bucket also counts everything longer (2^31 us is
  // about 36 minutes).
  static constexpr std::uint64_t upper_bound_us(std::size_t k) noexcept {
    return std::uint64_t{1} << k;
  }

  std::array<std::uint64_t, bucket_count> buckets{};
  // The sum of the buckets: the imports completed.
  std::uint64_t count = 0;
};

// A runtime's counters; `runtime::stats()` takes it (see above for what
// "consistent" means). Counts are since the runtime was created.
struct runtime_stats {
  // Imports begun and not yet completed: validating, waiting for budget or
  // staging chunks, copying. Unlike runtime::in_flight(), which counts the
  // operations shutdown must cancel, it counts every import, views included.
  std::uint64_t imports_in_flight = 0;
  // Requests for copy memory budget waiting in line (memory_budget::waiting):
  // one per import, one per batch for its members' copies together.
  std::uint64_t imports_waiting_for_budget = 0;
  // Imports completed: zero-copy views (those that waited for their
  // producer's stream included), copies, and failures of every kind
  // (refusals that left the tensor with its owner, cancellations, errors).
  std::uint64_t views = 0;
  std::uint64_t copies = 0;
  std::uint64_t failed = 0;
  transfer_bytes bytes;
  // Pinned staging chunks taken from the pool by uploads and downloads, and
  // the pool's size (runtime_options::staging_chunks); both 0 without a
  // CUDA backend.
  std::uint64_t staging_chunks_in_use = 0;
  std::uint64_t staging_chunks = 0;
  // From the start of each import's copy or wait to its completion. Imports
  // that complete inside the call without copying (views, refusals) are
  // counted in buckets[0], under 1 us, without reading the clock.
  latency_histogram latency;
};

// Four lines of text, for logs and the examples:
//
//   imports: 0 in flight, 0 waiting for budget; 120 views, 380 copies, 2 failed
//   bytes: host_to_host 1048576, pinned_to_gpu 0, pageable_to_gpu 67108864, ...
//   staging chunks: 0 of 8 in use
//   latency (502 imports): <1us 118, <2us 2, <256us 40, <512us 342
//
// The latency line names the buckets that are not empty, by upper bound.
std::string to_string(const runtime_stats& stats);

}  // namespace dlasync
