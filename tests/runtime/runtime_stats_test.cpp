#include "dlasync/runtime.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "asio/bind_executor.hpp"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/io_context.hpp"
#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "runtime/sim/sim_api.hpp"
#include "support/import_paths.hpp"
#include "support/runtime_fixture.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::make_runtime;
using testing::make_tensor;
using testing::matrix_source;
using testing::require_status;
using testing::second_cpu;
using testing::tensor_spec;

import_options onto(device d) {
  import_options o;
  o.target = d;
  return o;
}

absl::StatusOr<tensor> import_now(runtime& rt, const tensor_spec& spec, deleter_count& count,
                                  const import_options& o = {}) {
  managed_tensor source = make_tensor(spec, count);
  return async_import_dlpack(rt, source, o, asio::use_future).get();
}

std::uint64_t bucket_sum(const latency_histogram& h) {
  return std::accumulate(h.buckets.begin(), h.buckets.end(), std::uint64_t{0});
}

// The bytes of every path, in a row, for comparisons that name the path.
std::vector<std::uint64_t> all_bytes(const transfer_bytes& b) {
  return {b.host_to_host, b.pinned_to_gpu, b.pageable_to_gpu,
          b.gpu_to_host,  b.within_gpu,    b.gpu_to_gpu};
}

}  // namespace

TEST_CASE("a new runtime's stats are all zero, with no staging chunks on the host",
          "[runtime][stats]") {
  std::unique_ptr<runtime> rt = make_runtime();
  const runtime_stats s = rt->stats();
  CHECK(s.imports_in_flight == 0);
  CHECK(s.imports_waiting_for_budget == 0);
  CHECK(s.views + s.copies + s.failed == 0);
  CHECK(all_bytes(s.bytes) == std::vector<std::uint64_t>(6, 0));
  CHECK(s.staging_chunks_in_use == 0);
  CHECK(s.staging_chunks == 0);
  CHECK(s.latency.count == 0);
  CHECK(bucket_sum(s.latency) == 0);
}

TEST_CASE("views and copies are counted exactly, whichever form imports them", "[runtime][stats]") {
  // Copies of up to 64 KiB inline, larger ones on the workers.
  std::unique_ptr<runtime> rt = make_runtime(2, 0, {}, std::uint64_t{64} << 10);
  matrix_source small(16, 16);    // 1 KiB: copied inline
  matrix_source large(512, 512);  // 1 MiB: copied on the workers
  REQUIRE(small.bytes() <= rt->options().inline_copy_bytes);
  REQUIRE(large.bytes() > rt->options().inline_copy_bytes);
  std::vector<deleter_count> counts(16);
  int next = 0;
  std::vector<absl::StatusOr<tensor>> kept;

  // Views: three with a completion token, two synchronous, one awaited.
  for (int i = 0; i < 3; ++i) kept.push_back(import_now(*rt, small.spec, counts[next++]));
  for (int i = 0; i < 2; ++i) {
    managed_tensor source = make_tensor(small.spec, counts[next++]);
    kept.push_back(import_view(*rt, source));
  }
  {
    managed_tensor source = make_tensor(small.spec, counts[next++]);
    asio::io_context io;
    asio::co_spawn(
        io, [&]() -> asio::awaitable<void> { kept.push_back(co_await import_dlpack(*rt, source)); },
        asio::detached);
    io.run();
  }
  // Copies: two inline, one on the workers, two members of a batch.
  for (int i = 0; i < 2; ++i) {
    kept.push_back(import_now(*rt, small.spec, counts[next++], onto(second_cpu)));
  }
  kept.push_back(import_now(*rt, large.spec, counts[next++], onto(second_cpu)));
  {
    std::vector<managed_tensor> sources;
    for (int i = 0; i < 2; ++i) sources.push_back(make_tensor(small.spec, counts[next++]));
    for (absl::StatusOr<tensor>& t :
         async_import_dlpack_batch(*rt, sources, onto(second_cpu), asio::use_future).get()) {
      kept.push_back(std::move(t));
    }
  }
  for (const absl::StatusOr<tensor>& t : kept) REQUIRE(t.ok());

  const runtime_stats s = rt->stats();
  CHECK(s.views == 6);
  CHECK(s.copies == 5);
  CHECK(s.failed == 0);
  CHECK(s.bytes.host_to_host == 4 * small.bytes() + large.bytes());
  CHECK(all_bytes(s.bytes) ==
        std::vector<std::uint64_t>{4 * small.bytes() + large.bytes(), 0, 0, 0, 0, 0});
  CHECK(s.imports_in_flight == 0);
  CHECK(s.imports_waiting_for_budget == 0);
  CHECK(s.latency.count == 11);
  CHECK(bucket_sum(s.latency) == 11);
  // The six views completed inside their calls: the first bucket has them.
  CHECK(s.latency.buckets[0] >= 6);
  // The copies' deleters run on the releaser: shutdown waits for them, before
  // what they count goes.
  rt->shutdown();
}

TEST_CASE("refusals and failures count as failed, never as views or copies", "[runtime][stats]") {
  std::unique_ptr<runtime> rt = make_runtime();
  matrix_source m(8, 8);
  deleter_count count;
  {
    INFO("a malformed shape");
    tensor_spec bad = m.spec;
    bad.shape = {8, -1};
    require_status(import_now(*rt, bad, count).status(), absl::StatusCode::kInvalidArgument,
                   {"shape[1] is -1"});
  }
  {
    INFO("copy=false when a copy is needed");
    import_options o = onto(second_cpu);
    o.copy = false;
    CHECK(import_now(*rt, m.spec, count, o).status().code() ==
          absl::StatusCode::kFailedPrecondition);
  }
  {
    INFO("import_view when a copy is needed");
    managed_tensor source = make_tensor(m.spec, count);
    require_status(import_view(*rt, source, onto(second_cpu)).status(),
                   absl::StatusCode::kFailedPrecondition, {"zero-copy view", "not consumed"});
  }
  {
    INFO("a batch refused as a whole over the budget: each member counts");
    std::unique_ptr<runtime> small = make_runtime(2, 300);
    std::vector<managed_tensor> sources;
    for (int i = 0; i < 2; ++i) sources.push_back(make_tensor(m.spec, count));
    for (const absl::StatusOr<tensor>& t :
         async_import_dlpack_batch(*small, sources, onto(second_cpu), asio::use_future).get()) {
      CHECK(t.status().code() == absl::StatusCode::kResourceExhausted);
    }
    const runtime_stats s = small->stats();
    CHECK(s.failed == 2);
    CHECK(s.imports_in_flight == 0);
  }
  rt->shutdown();
  require_status(import_now(*rt, m.spec, count).status(), absl::StatusCode::kUnavailable,
                 {"shutting down"});

  const runtime_stats s = rt->stats();
  CHECK(s.failed == 4);
  CHECK(s.views == 0);
  CHECK(s.copies == 0);
  CHECK(all_bytes(s.bytes) == std::vector<std::uint64_t>(6, 0));
  CHECK(s.imports_in_flight == 0);
  CHECK(s.latency.count == 4);
  // Refused inside the call: counted once, in the first bucket, unclocked.
  CHECK(s.latency.buckets[0] == 4);
}

TEST_CASE("an import waiting for the budget is in flight and waiting until it gets it",
          "[runtime][stats]") {
  std::unique_ptr<runtime> rt = make_runtime(2, 1024);
  matrix_source m(16, 16);  // 1 KiB: the whole budget
  deleter_count held_count;
  absl::StatusOr<tensor> held = import_now(*rt, m.spec, held_count, onto(second_cpu));
  REQUIRE(held.ok());

  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  asio::io_context io;
  absl::StatusOr<tensor> result = absl::UnknownError("not delivered");
  async_import_dlpack(*rt, source, onto(second_cpu),
                      asio::bind_executor(io, [&](absl::StatusOr<tensor> t) {
                        result = std::move(t);
                        // Counted before the handler runs.
                        CHECK(rt->stats().imports_in_flight == 0);
                      }));
  runtime_stats s = rt->stats();
  CHECK(s.imports_waiting_for_budget == 1);
  CHECK(s.imports_in_flight == 1);
  CHECK(s.copies == 1);

  held = absl::UnknownError("dropped");  // the budget comes back
  io.run();
  REQUIRE(result.ok());
  s = rt->stats();
  CHECK(s.imports_waiting_for_budget == 0);
  CHECK(s.imports_in_flight == 0);
  CHECK(s.copies == 2);
  CHECK(s.bytes.host_to_host == 2 * m.bytes());
  CHECK(s.latency.count == 2);
  CHECK(testing::released(count));
}

TEST_CASE("an import's latency lands in the bucket of its duration", "[runtime][stats]") {
  // Each piece of a host copy takes at least 2 ms: the copy, at least 8 ms.
  std::unique_ptr<runtime> rt =
      make_runtime(2, 0, [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); });
  matrix_source m(1024, 1024);  // 4 MiB, several pieces
  deleter_count count;
  REQUIRE(import_now(*rt, m.spec, count, onto(second_cpu)).ok());
  const runtime_stats s = rt->stats();
  REQUIRE(s.latency.count == 1);
  std::size_t bucket = 0;
  while (s.latency.buckets[bucket] == 0) ++bucket;
  INFO("bucket " << bucket);
  // At least 8 ms (bucket 14 holds [8192, 16384) us), under the 30 s a
  // hung test would take.
  CHECK(bucket >= 14);
  CHECK(latency_histogram::upper_bound_us(bucket) <= std::uint64_t{1} << 25);
}

TEST_CASE("latency buckets are log2 microseconds, and to_string names the filled ones",
          "[runtime][stats]") {
  CHECK(latency_histogram::upper_bound_us(0) == 1);
  CHECK(latency_histogram::upper_bound_us(1) == 2);
  CHECK(latency_histogram::upper_bound_us(20) == 1 << 20);
  runtime_stats s;
  s.imports_in_flight = 1;
  s.imports_waiting_for_budget = 2;
  s.views = 3;
  s.copies = 4;
  s.failed = 5;
  s.bytes = {10, 11, 12, 13, 14, 15};
  s.staging_chunks_in_use = 6;
  s.staging_chunks = 8;
  s.latency.buckets[0] = 7;
  s.latency.buckets[9] = 4;
  s.latency.buckets[latency_histogram::bucket_count - 1] = 1;
  s.latency.count = 12;
  CHECK(to_string(s) ==
        "imports: 1 in flight, 2 waiting for budget; 3 views, 4 copies, 5 failed\n"
        "bytes: host_to_host 10, pinned_to_gpu 11, pageable_to_gpu 12, gpu_to_host 13, "
        "within_gpu 14, gpu_to_gpu 15\n"
        "staging chunks: 6 of 8 in use\n"
        "latency (12 imports): <1us 7, <512us 4, >=1073741824us 1");
}

TEST_CASE("counts stay exact, and never contradict each other, under imports from many threads",
          "[runtime][stats]") {
  std::unique_ptr<runtime> rt = make_runtime();
  matrix_source m(8, 8);
  constexpr int threads = 4;
  constexpr int per_thread = 250;
  std::atomic<int> done{0};
  std::atomic<int> failed{0};
  std::atomic<bool> reading{true};
  std::atomic<int> contradictions{0};
  // A reader takes snapshots all along: the sums must hold in each.
  std::thread reader([&] {
    while (reading.load()) {
      const runtime_stats s = rt->stats();
      const std::uint64_t completed = s.views + s.copies + s.failed;
      if (s.latency.count > completed || bucket_sum(s.latency) != s.latency.count ||
          s.imports_in_flight > threads * per_thread) {
        contradictions.fetch_add(1);
      }
    }
  });
  std::vector<deleter_count> counts(threads * per_thread);
  const bool finished = testing::start_from_threads(
      threads, per_thread,
      [&](int n, asio::io_context& io) {
        auto source = std::make_shared<managed_tensor>(make_tensor(m.spec, counts[n]));
        async_import_dlpack(*rt, *source, onto(n % 2 == 0 ? host_device : second_cpu),
                            asio::bind_executor(io, [&, source](const absl::StatusOr<tensor>& t) {
                              if (!t.ok()) failed.fetch_add(1);
                              done.fetch_add(1);
                            }));
      },
      [&] { return done.load() == threads * per_thread; });
  reading.store(false);
  reader.join();
  REQUIRE(finished);
  CHECK(failed.load() == 0);
  CHECK(contradictions.load() == 0);
  const runtime_stats s = rt->stats();
  CHECK(s.views == threads * per_thread / 2);
  CHECK(s.copies == threads * per_thread / 2);
  CHECK(s.failed == 0);
  CHECK(s.bytes.host_to_host == threads * per_thread / 2 * m.bytes());
  CHECK(s.imports_in_flight == 0);
  CHECK(s.latency.count == threads * per_thread);
}

TEST_CASE("simulated GPU copies count their bytes on the path that moved them",
          "[runtime][stats][cuda]") {
  testing::sim_runtime r = testing::make_sim_runtime({}, [](runtime_options& o) {
    o.staging_chunks = 4;
    o.staging_chunk_bytes = 64 << 10;
  });
  auto unfreed = std::make_shared<testing::unfreed_memory>();
  // Which field of transfer_bytes each path adds to, in all_bytes' order.
  auto field_of = [](const testing::path_case& p) -> std::size_t {
    const bool host_source = p.source.kind == device_kind::cpu;
    const bool pinned_source = p.source.kind == device_kind::cuda_host;
    if (!p.target) return 4;                               // within_gpu
    if (p.target->kind == device_kind::cpu) return 3;      // gpu_to_host
    if (pinned_source) return 1;                           // pinned_to_gpu
    if (host_source) return 2;                             // pageable_to_gpu
    return p.target->ordinal == p.source.ordinal ? 4 : 5;  // within_gpu, gpu_to_gpu
  };
  int imported = 0;
  for (const testing::path_case& p : testing::paths()) {
    if (p.producer_stream || p.consumer_stream) continue;  // ordering, not bytes
    INFO(p.name);
    const std::vector<std::uint64_t> before = all_bytes(r.rt->stats().bytes);
    testing::source_memory memory(*r.sim, unfreed, p);
    tensor_spec spec;
    spec.device = p.source;
    spec.shape = p.shape;
    spec.strides = p.strides;
    spec.data = memory.data;
    import_options o;
    o.target = p.target;
    o.copy = p.copy;
    deleter_count count;
    {
      absl::StatusOr<tensor> t = import_now(*r.rt, spec, count, o);
      REQUIRE(t.ok());
      CHECK(testing::mismatch(*t, p).empty());
    }
    CHECK(testing::released(count));
    ++imported;
    std::vector<std::uint64_t> expected = before;
    expected[field_of(p)] += memory.elements * sizeof(float);
    CHECK(all_bytes(r.rt->stats().bytes) == expected);
  }
  const runtime_stats s = r.rt->stats();
  CHECK(s.copies == static_cast<std::uint64_t>(imported));
  CHECK(s.imports_in_flight == 0);
  CHECK(s.staging_chunks == 4);
  CHECK(testing::eventually([&] { return r.rt->stats().staging_chunks_in_use == 0; }));
  unfreed->free_all(*r.sim);
}

TEST_CASE("staging chunks show in use while an upload holds them, and none after",
          "[runtime][stats][cuda]") {
  cuda::sim_options so;
  so.host_to_device_gbps = 0.05;  // 64 KiB chunks take over a millisecond each
  testing::sim_runtime r = testing::make_sim_runtime(so, [](runtime_options& o) {
    o.staging_chunks = 4;
    o.staging_chunk_bytes = 64 << 10;
  });
  matrix_source m(1024, 1024);  // 4 MiB: 64 chunks
  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  std::future<absl::StatusOr<tensor>> f =
      async_import_dlpack(*r.rt, source, onto({device_kind::cuda, 0}), asio::use_future);
  runtime_stats during;
  CHECK(testing::eventually([&] {
    during = r.rt->stats();
    return during.staging_chunks_in_use > 0;
  }));
  CHECK(during.staging_chunks_in_use <= 4);
  // The chunks are read after the counters, and go back before the import
  // completes: the import was in flight at that read.
  CHECK(during.imports_in_flight == 1);
  REQUIRE(f.get().ok());
  CHECK(testing::eventually([&] { return r.rt->stats().staging_chunks_in_use == 0; }));
  const runtime_stats s = r.rt->stats();
  CHECK(s.bytes.pageable_to_gpu == m.bytes());
  CHECK(s.copies == 1);
  CHECK(s.imports_in_flight == 0);
  // Shutdown lets the CUDA backend go; the stats still read.
  r.rt->shutdown();
  CHECK(r.rt->stats().staging_chunks == 4);
  CHECK(r.rt->stats().copies == 1);
}

}  // namespace dlasync
