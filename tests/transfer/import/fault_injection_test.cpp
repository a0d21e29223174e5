// Systematic fault injection on two simulated GPUs: for every import path,
// each CUDA call the import makes is failed in turn (every call of every
// function the clean run makes), once as a plain error and once as a sticky
// error that corrupts the context. Every run must end with a status (no
// hang), name the CUDA error when it fails, deliver correct data when it
// succeeds, call the deleter exactly once, and leave no device or pinned
// memory behind; after a plain error the same runtime serves the next import
// correctly, after a sticky one host imports still work and GPU imports fail
// clearly. The deleter frees the source memory at once, so that a copy
// still reading it afterwards shows under ASan as a use after free.
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"
#include "support/cuda_scenarios.hpp"
#include "support/import_paths.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::make_tensor;
using testing::path_case;
using testing::paths;
using testing::require_status;
using testing::source_memory;
using testing::tensor_spec;
using testing::unfreed_memory;

constexpr cuda::error injected = cuda::error::launch_failure;

// Calls the test makes itself (the source memory's frees in the deleter):
// not part of the import's calls.
bool test_call(const std::string& call) {
  return call == "cudaFree" || call == "cudaFreeHost";
}

struct world {
  std::shared_ptr<cuda::sim_api> sim;
  std::shared_ptr<unfreed_memory> unfreed = std::make_shared<unfreed_memory>();
  std::unique_ptr<runtime> rt;
  cuda::stream_t producer = nullptr;  // on the path's source GPU
  cuda::stream_t consumer = nullptr;  // on cuda:0

  explicit world(const path_case& p) {
    cuda::sim_options so;
    so.min_sleep_us = 1e9;  // copies take no simulated time
    testing::sim_runtime r = testing::make_sim_runtime(so, [](runtime_options& o) {
      o.staging_chunks = 2;
      o.staging_chunk_bytes = 4 << 10;
    });
    sim = std::move(r.sim);
    rt = std::move(r.rt);
    if (p.producer_stream) {
      sim->set_device(p.source.ordinal);
      REQUIRE(sim->stream_create(&producer, cuda::stream_flags::non_blocking) ==
              cuda::error::success);
    }
    if (p.consumer_stream) {
      sim->set_device(0);
      REQUIRE(sim->stream_create(&consumer, cuda::stream_flags::non_blocking) ==
              cuda::error::success);
    }
  }

  ~world() {
    sim->clear_faults();
    if (producer != nullptr) sim->stream_destroy(producer);
    if (consumer != nullptr) sim->stream_destroy(consumer);
    rt.reset();
  }

  std::shared_ptr<source_memory> memory_for(const path_case& p) {
    return std::make_shared<source_memory>(*sim, unfreed, p);
  }

  // Imports the path's tensor out of `m`, which its deleter frees; a hang
  // fails the test instead of the suite.
  absl::StatusOr<tensor> import(const path_case& p, std::shared_ptr<source_memory> m,
                                deleter_count& count) {
    tensor_spec s;
    s.device = p.source;
    s.shape = p.shape;
    s.strides = p.strides;
    s.data = m->data;
    count.on_delete = [m = std::move(m)]() mutable { m.reset(); };
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.target = p.target;
    o.copy = p.copy;
    o.require_contiguous = true;
    if (p.producer_stream) o.stream = reinterpret_cast<std::int64_t>(producer);
    if (p.consumer_stream) o.consumer_stream = reinterpret_cast<std::int64_t>(consumer);
    std::future<absl::StatusOr<tensor>> f = async_import_dlpack(*rt, source, o, asio::use_future);
    if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      FAIL("the import hung");
    }
    absl::StatusOr<tensor> t = f.get();
    if (t.ok() && consumer != nullptr) {
      // After an early resume, errors reach the caller through its stream.
      if (const cuda::error e = sync_consumer(); e != cuda::error::success) {
        return cuda::to_status(e, "the consumer stream", 0);
      }
    }
    return t;
  }

  // Waits until the consumer stream has run what it holds. A one-shot fault
  // may hit these calls too (the import's own calls go on after an early
  // resume): they are retried; a failed context is returned.
  cuda::error sync_consumer() {
    for (int attempt = 0;; ++attempt) {
      cuda::error err = sim->set_device(0);
      cuda::event_t e = nullptr;
      if (err == cuda::error::success) err = sim->event_create(&e);
      if (err == cuda::error::success) {
        err = sim->event_record(e, consumer);
        while (err == cuda::error::success) {
          err = sim->event_query(e);
          if (err != cuda::error::not_ready) break;
          err = cuda::error::success;
          std::this_thread::yield();
        }
        sim->event_destroy(e);
      }
      if (err == cuda::error::success || sim->sticky_error() != cuda::error::success ||
          attempt == 3) {
        return err;
      }
    }
  }
};

void check_values(const tensor& t, const path_case& p) {
  if (const std::string wrong = testing::mismatch(t, p); !wrong.empty()) FAIL(wrong);
}

// The CUDA calls the clean import of `p` makes, per cudart function. The
// reactor polls cudaEventQuery as often as timing has it: its first few
// calls are taken.
std::map<std::string, std::uint64_t> calls_of(const path_case& p) {
  world w(p);
  std::shared_ptr<source_memory> m = w.memory_for(p);
  deleter_count count;
  const std::map<std::string, std::uint64_t> before = w.sim->call_counts();
  absl::StatusOr<tensor> t = w.import(p, std::move(m), count);
  REQUIRE(t.ok());
  check_values(*t, p);
  // A view holds the source; after an early resume it is released a moment
  // later.
  t = absl::UnknownError("dropped");
  REQUIRE(testing::eventually([&] { return count.calls == 1; }));
  std::map<std::string, std::uint64_t> calls = w.sim->call_counts();
  for (auto& [name, n] : calls) {
    auto it = before.find(name);
    if (it != before.end()) n -= it->second;
  }
  std::erase_if(calls,
                [](const auto& entry) { return entry.second == 0 || test_call(entry.first); });
  if (auto polls = calls.find("cudaEventQuery"); polls != calls.end()) {
    polls->second = std::min<std::uint64_t>(polls->second, 3);
  }
  return calls;
}

void run_with_fault(const path_case& p, const std::string& call, std::uint64_t nth, bool sticky) {
  INFO(p.name << ": " << call << " #" << nth << (sticky ? ", sticky" : ""));
  world w(p);
  {
    // Source memory is allocated before the fault is armed. The import's
    // deleter frees it.
    std::shared_ptr<source_memory> memory = w.memory_for(p);
    std::shared_ptr<source_memory> again_memory = w.memory_for(p);
    deleter_count count;
    if (sticky) {
      w.sim->fail_call(call, static_cast<int>(nth), injected, true);
    } else {
      w.sim->fail_call(call, static_cast<int>(nth), injected);
    }
    absl::StatusOr<tensor> t = w.import(p, std::move(memory), count);
    if (t.ok()) {
      // The fault hit a call whose failure the import survives (or none).
      check_values(*t, p);
    } else {
      INFO("status: " << t.status().ToString());
      CHECK(std::string(t.status().message()).find("cudaErrorLaunchFailure") != std::string::npos);
    }
    t = absl::UnknownError("dropped");
    CHECK(testing::eventually([&] { return count.calls == 1; }));
    CHECK(count.calls == 1);

    if (sticky && w.sim->sticky_error() == cuda::error::success) {
      // Event pooling and polling vary from run to run: this run did not
      // reach the call. Nothing more to check than above.
      w.sim->clear_faults();
    } else if (sticky) {
      // The context is lost: GPU imports fail with its error, host ones work.
      deleter_count after;
      path_case gpu = p;
      absl::StatusOr<tensor> again = w.import(gpu, std::move(again_memory), after);
      if (p.source.kind == device_kind::cuda || (p.target && p.target->kind == device_kind::cuda)) {
        CHECK_FALSE(again.ok());
      }
      again = absl::UnknownError("dropped");
      CHECK(testing::eventually([&] { return after.calls == 1; }));
      std::vector<float> host(256, 1.0f);
      tensor_spec s;
      s.shape = {256};
      s.data = host.data();
      deleter_count host_count;
      managed_tensor source = make_tensor(s, host_count);
      import_options o;
      o.copy = true;
      absl::StatusOr<tensor> on_host =
          async_import_dlpack(*w.rt, source, o, asio::use_future).get();
      REQUIRE(on_host.ok());
      CHECK(static_cast<const float*>(on_host->data())[255] == 1.0f);
      w.sim->clear_faults();
    } else {
      // The same runtime serves the next import correctly. (A fault that
      // the import did not reach, as event pooling and polling vary from
      // run to run, is disarmed first.)
      w.sim->clear_faults();
      deleter_count next;
      absl::StatusOr<tensor> clean = w.import(p, w.memory_for(p), next);
      INFO("the next import: " << clean.status().ToString());
      REQUIRE(clean.ok());
      check_values(*clean, p);
      clean = absl::UnknownError("dropped");
      CHECK(testing::eventually([&] { return next.calls == 1; }));
    }
    again_memory.reset();
  }
  // Nothing left behind once the runtime is gone. After a sticky error the
  // frees themselves fail, as in CUDA, where only a device reset reclaims a
  // corrupted context's memory: device memory is checked after plain ones.
  w.sim->clear_faults();
  w.rt.reset();
  w.unfreed->free_all(*w.sim);
  if (!sticky) {
    CHECK(testing::eventually(
        [&] { return w.sim->device_bytes_in_use(0) == 0 && w.sim->device_bytes_in_use(1) == 0; }));
  }
  // The CUDA context may be torn down a moment after the runtime, off the
  // thread of its last callback.
  CHECK(testing::eventually([&] { return w.sim->host_bytes_pinned() == 0; }));
}

}  // namespace

TEST_CASE("every CUDA call of every import path can fail without a hang, leak or lost deleter",
          "[cuda][faults]") {
  int runs = 0;
  for (const path_case& p : paths()) {
    const std::map<std::string, std::uint64_t> calls = calls_of(p);
    REQUIRE_FALSE(calls.empty());
    for (const auto& [call, n] : calls) {
      for (std::uint64_t nth = 1; nth <= n; ++nth) {
        run_with_fault(p, call, nth, false);
        run_with_fault(p, call, nth, true);
        runs += 2;
      }
    }
  }
  WARN(runs << " imports with an injected fault over " << paths().size() << " paths");
}

}  // namespace dlasync
