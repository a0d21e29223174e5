// The import contract's promises that cross operations: batches and the
// budget, where deleters and grants run, Asio's conventions (cancellation
// types, throwing handlers), and shutdown. Every test counts deleters.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "asio/bind_cancellation_slot.hpp"
#include "asio/bind_executor.hpp"
#include "asio/cancellation_signal.hpp"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/executor_work_guard.hpp"
#include "asio/io_context.hpp"
#include "asio/post.hpp"
#include "asio/thread_pool.hpp"
#include "asio/use_awaitable.hpp"
#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "dlasync/import.hpp"
#include "runtime/src/runtime_core.hpp"
#include "support/copy_budget.hpp"
#include "support/cuda_scenarios.hpp"
#include "support/runtime_fixture.hpp"
#include "support/sim_reports.hpp"
#include "support/sim_runtime.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::make_runtime;
using testing::make_tensor;
using testing::require_status;
using testing::second_cpu;
using testing::tensor_spec;
constexpr std::uint64_t kib = 1024;

import_options onto(device d) {
  import_options o;
  o.target = d;
  return o;
}

// `bytes` of floats counting up, as a 1-d tensor spec.
struct host_source {
  std::vector<float> data;
  tensor_spec spec;
  explicit host_source(std::uint64_t bytes) : data(bytes / sizeof(float)) {
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
    spec.shape = {static_cast<std::int64_t>(data.size())};
    spec.data = data.data();
  }
};

// A gate a deleter blocks on until the test opens it (or 240 s pass, far
// beyond any wait of the test's, on a loaded machine and under sanitizers).
struct gate {
  std::promise<void> opened;
  std::shared_future<void> wait_for = opened.get_future().share();
  void open() { opened.set_value(); }
  void block() const { wait_for.wait_for(std::chrono::seconds(240)); }
};

// Starts a batch of `count` tensors of `source` (their deleters counted in
// `counts`) with a callback bound to `signal`'s slot; the future holds the
// results.
std::future<std::vector<absl::StatusOr<tensor>>> start_cancellable_batch(
    runtime& rt, const host_source& source, std::vector<deleter_count>& counts,
    std::vector<managed_tensor>& sources, const import_options& options,
    asio::cancellation_signal& signal) {
  for (deleter_count& c : counts) sources.push_back(make_tensor(source.spec, c));
  auto got = std::make_shared<std::promise<std::vector<absl::StatusOr<tensor>>>>();
  std::future<std::vector<absl::StatusOr<tensor>>> result = got->get_future();
  async_import_dlpack_batch(
      rt, sources, options,
      asio::bind_cancellation_slot(signal.slot(), [got](std::vector<absl::StatusOr<tensor>> r) {
        got->set_value(std::move(r));
      }));
  return result;
}

}  // namespace

TEST_CASE("a batch whose copies exceed the whole budget together is refused, nothing consumed",
          "[transfer][contract][batch]") {
  // Three 64 KiB copies under a 100 KiB budget: each fits alone. This
  // batch once never completed, one member holding 64 KiB and two waiting.
  std::unique_ptr<runtime> rt = make_runtime(2, 100 * kib);
  host_source a(64 * kib);
  std::vector<deleter_count> counts(3);
  std::vector<managed_tensor> sources;
  for (deleter_count& c : counts) sources.push_back(make_tensor(a.spec, c));
  std::vector<absl::StatusOr<tensor>> results =
      async_import_dlpack_batch(*rt, sources, onto(second_cpu), asio::use_future).get();
  REQUIRE(results.size() == 3);
  for (const absl::StatusOr<tensor>& r : results) {
    require_status(r.status(), absl::StatusCode::kResourceExhausted,
                   {"this batch of 3 tensors needs 196608 bytes", "102400", "not consumed",
                    "smaller batches"});
  }
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK_FALSE(sources[i].empty());
    CHECK(counts[i].calls == 0);
  }
  CHECK(testing::copy_budget(*rt).in_use() == 0);
  sources.clear();
  for (deleter_count& c : counts) CHECK(c.calls == 1);
}

TEST_CASE("a batch reserves its members' budget together and never deadlocks on itself",
          "[transfer][contract][batch]") {
  std::unique_ptr<runtime> rt = make_runtime(2, 100 * kib);
  host_source small(30 * kib);
  // Another import holds 64 KiB: the batch's 90 KiB must wait for all of it,
  // not start one member and leave the others waiting behind it.
  deleter_count held_count;
  host_source big(64 * kib);
  managed_tensor held_source = make_tensor(big.spec, held_count);
  absl::StatusOr<tensor> held =
      async_import_dlpack(*rt, held_source, onto(second_cpu), asio::use_future).get();
  REQUIRE(held.ok());

  std::vector<deleter_count> counts(3);
  std::vector<managed_tensor> sources;
  for (deleter_count& c : counts) sources.push_back(make_tensor(small.spec, c));
  std::future<std::vector<absl::StatusOr<tensor>>> batch =
      async_import_dlpack_batch(*rt, sources, onto(second_cpu), asio::use_future);
  for (const managed_tensor& s : sources) CHECK(s.empty());  // validated and taken
  CHECK(testing::copy_budget(*rt).waiting() == 1);           // one reservation for all
  CHECK(testing::copy_budget(*rt).in_use() == 64 * kib);
  held = tensor();  // frees 64 KiB: the batch's 90 KiB now fit
  REQUIRE(batch.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  std::vector<absl::StatusOr<tensor>> results = batch.get();
  for (const absl::StatusOr<tensor>& r : results) {
    REQUIRE(r.ok());
    CHECK(r->is_copy());
    CHECK(static_cast<const float*>(r->data())[100] == 100.0f);
  }
  for (deleter_count& c : counts) CHECK(testing::released(c));
  CHECK(testing::copy_budget(*rt).in_use() == 90 * kib);
  results.clear();
  CHECK(testing::copy_budget(*rt).in_use() == 0);
}

TEST_CASE("cancelling a batch that waits for its budget releases every member",
          "[transfer][contract][batch][cancel]") {
  std::unique_ptr<runtime> rt = make_runtime(2, 64 * kib);
  host_source block(64 * kib);
  deleter_count held_count;
  managed_tensor held_source = make_tensor(block.spec, held_count);
  absl::StatusOr<tensor> held =
      async_import_dlpack(*rt, held_source, onto(second_cpu), asio::use_future).get();
  REQUIRE(held.ok());

  host_source small(8 * kib);
  std::vector<deleter_count> counts(2);
  std::vector<managed_tensor> sources;
  asio::cancellation_signal signal;
  auto got = start_cancellable_batch(*rt, small, counts, sources, onto(second_cpu), signal);
  CHECK(testing::copy_budget(*rt).waiting() == 1);
  signal.emit(asio::cancellation_type::terminal);
  std::vector<absl::StatusOr<tensor>> results = got.get();
  for (const absl::StatusOr<tensor>& r : results) {
    require_status(r.status(), absl::StatusCode::kCancelled, {"waited for copy memory budget"});
  }
  for (deleter_count& c : counts) CHECK(testing::released(c));
  CHECK(testing::copy_budget(*rt).waiting() == 0);
  CHECK(testing::eventually([&] { return rt->in_flight() == 0; }));
}

TEST_CASE("a batch that completes at once gets its cancellation slot before it completes",
          "[transfer][contract][batch][cancel]") {
  // Views complete as the batch starts, and the handler (on the runtime's
  // executor thread) clears its slot: the slot must have been assigned
  // before, on this thread. ThreadSanitizer saw the two race when the batch
  // was started before its slot was assigned.
  std::unique_ptr<runtime> rt = make_runtime(2, 0);
  host_source small(4 * kib);
  for (int round = 0; round < 20; ++round) {
    std::vector<deleter_count> counts(3);
    std::vector<managed_tensor> sources;
    asio::cancellation_signal signal;
    std::vector<absl::StatusOr<tensor>> results =
        start_cancellable_batch(*rt, small, counts, sources, {}, signal).get();
    for (const absl::StatusOr<tensor>& r : results) {
      REQUIRE(r.ok());
      CHECK(r->is_view());
    }
    results.clear();
    for (deleter_count& c : counts) CHECK(c.calls == 1);
  }
}

TEST_CASE("terminal and partial cancellation stop an import; total is not honoured",
          "[transfer][contract][cancel][asio]") {
  const asio::cancellation_type type =
      GENERATE(asio::cancellation_type::terminal, asio::cancellation_type::partial,
               asio::cancellation_type::total);
  INFO("cancellation type " << static_cast<int>(type));
  std::unique_ptr<runtime> rt = make_runtime(2, 64 * kib);
  host_source block(64 * kib);
  deleter_count held_count;
  managed_tensor held_source = make_tensor(block.spec, held_count);
  absl::StatusOr<tensor> held =
      async_import_dlpack(*rt, held_source, onto(second_cpu), asio::use_future).get();
  REQUIRE(held.ok());

  host_source small(4 * kib);
  deleter_count count;
  managed_tensor source = make_tensor(small.spec, count);
  asio::cancellation_signal signal;
  std::promise<absl::StatusOr<tensor>> got;
  async_import_dlpack(*rt, source, onto(second_cpu),
                      asio::bind_cancellation_slot(signal.slot(), [&](absl::StatusOr<tensor> t) {
                        got.set_value(std::move(t));
                      }));
  CHECK(source.empty());  // consumed when it started
  CHECK(testing::copy_budget(*rt).waiting() == 1);
  signal.emit(type);
  std::future<absl::StatusOr<tensor>> result = got.get_future();
  if (type == asio::cancellation_type::total) {
    // No side effect is possible once the source is consumed: the import
    // goes on, and completes once the budget has room.
    CHECK(testing::copy_budget(*rt).waiting() == 1);
    CHECK(count.calls == 0);
    held = tensor();
    absl::StatusOr<tensor> t = result.get();
    REQUIRE(t.ok());
    CHECK(static_cast<const float*>(t->data())[7] == 7.0f);
  } else {
    require_status(result.get().status(), absl::StatusCode::kCancelled,
                   {"cancelled", "waited for copy memory budget", "released"});
    CHECK(testing::copy_budget(*rt).waiting() == 0);
  }
  CHECK(testing::released(count));
}

TEST_CASE("a slow deleter does not delay other imports: the reactor only hands off",
          "[transfer][contract][threads]") {
  // Uploads to simulated GPUs complete on the CUDA reactor's thread. A
  // producer's deleter that blocks (a Python deleter waiting for the GIL)
  // once stalled every GPU there. Deleters run on the releaser, one after
  // the other: the other imports' deleters wait behind the slow one, their
  // imports do not.
  cuda::sim_options so;
  so.devices = 2;
  testing::sim_runtime r =
      testing::make_sim_runtime(so, [](runtime_options& o) { o.worker_threads = 3; });
  host_source bytes(64 * kib);
  gate blocked;
  deleter_count slow;
  std::atomic<bool> slow_started{false};
  slow.on_delete = [&] {
    slow_started = true;
    blocked.block();
  };
  managed_tensor first = make_tensor(bytes.spec, slow);
  std::future<absl::StatusOr<tensor>> stalled =
      async_import_dlpack(*r.rt, first, onto(device{device_kind::cuda, 0}), asio::use_future);
  REQUIRE(testing::eventually([&] { return slow_started.load(); }));

  // While that deleter blocks, imports onto the other GPU complete.
  std::vector<deleter_count> counts(4);
  for (deleter_count& count : counts) {
    managed_tensor other = make_tensor(bytes.spec, count);
    std::future<absl::StatusOr<tensor>> f =
        async_import_dlpack(*r.rt, other, onto(device{device_kind::cuda, 1}), asio::use_future);
    const bool completed = f.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
    if (!completed) blocked.open();  // do not hang the suite
    REQUIRE(completed);
    REQUIRE(f.get().ok());
  }
  CHECK(slow.calls == 0);
  blocked.open();
  REQUIRE(stalled.get().ok());
  CHECK(testing::released(slow));
  for (deleter_count& count : counts) CHECK(testing::released(count));
}

TEST_CASE("a handler that throws on the runtime's executor is reported, and the executor goes on",
          "[transfer][contract][shutdown]") {
  std::atomic<int> reported{0};
  runtime_options o;
  o.topology = process_topology::single_process(2);
  o.worker_threads = 2;
  o.on_handler_exception = [&](const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::runtime_error& error) {
      if (std::string(error.what()) == "handler failed") ++reported;
    }
  };
  absl::StatusOr<std::unique_ptr<runtime>> created = runtime::create(o);
  REQUIRE(created.ok());
  runtime& rt = **created;

  host_source bytes(4 * kib);
  deleter_count count;
  managed_tensor source = make_tensor(bytes.spec, count);
  // The handler has no executor of its own: it runs on the runtime's.
  async_import_dlpack(rt, source, onto(second_cpu), [](const absl::StatusOr<tensor>& t) {
    if (t.ok()) throw std::runtime_error("handler failed");
  });
  REQUIRE(testing::eventually([&] { return reported.load() == 1; }));
  CHECK(count.calls == 1);
  // The executor still runs handlers.
  std::promise<void> ran;
  asio::post(rt.get_executor(), [&] { ran.set_value(); });
  CHECK(ran.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  CHECK(rt.handler_exceptions() == 1);
}

TEST_CASE("concurrent shutdowns all return after every deleter has run",
          "[transfer][contract][shutdown]") {
  std::unique_ptr<runtime> rt = make_runtime(2, 64 * kib);
  host_source block(64 * kib);
  deleter_count held_count;
  managed_tensor held_source = make_tensor(block.spec, held_count);
  absl::StatusOr<tensor> held =
      async_import_dlpack(*rt, held_source, onto(second_cpu), asio::use_future).get();
  REQUIRE(held.ok());
  // An import waiting for budget: shutdown cancels it and runs its deleter,
  // which takes a while.
  host_source small(4 * kib);
  deleter_count slow;
  slow.on_delete = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
  managed_tensor source = make_tensor(small.spec, slow);
  std::future<absl::StatusOr<tensor>> waiting =
      async_import_dlpack(*rt, source, onto(second_cpu), asio::use_future);
  REQUIRE(testing::copy_budget(*rt).waiting() == 1);

  std::atomic<int> returned_before_deleter{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < 3; ++i) {
    callers.emplace_back([&] {
      rt->shutdown();
      if (slow.calls.load() != 1) ++returned_before_deleter;
    });
  }
  for (std::thread& t : callers) t.join();
  CHECK(returned_before_deleter == 0);
  CHECK(slow.calls == 1);
  require_status(waiting.get().status(), absl::StatusCode::kCancelled, {"cancelled"});
}

TEST_CASE(
    "a view whose handler is queued on the runtime's executor at shutdown is released "
    "before shutdown returns",
    "[transfer][contract][shutdown]") {
  std::unique_ptr<runtime> rt = make_runtime(2);
  // The executor's one thread is busy until the runtime stops it, so the
  // handler stays queued.
  asio::io_context& context = detail::core_of(*rt).io();
  std::promise<void> busy;
  asio::post(rt->get_executor(), [&] {
    busy.set_value();
    while (!context.stopped()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  busy.get_future().wait();
  host_source bytes(4 * kib);
  deleter_count count;
  managed_tensor source = make_tensor(bytes.spec, count);
  std::atomic<bool> called{false};
  async_import_dlpack(*rt, source, import_options{},
                      [&](const absl::StatusOr<tensor>&) { called = true; });
  CHECK(source.empty());  // a view, delivered through the queue
  CHECK(count.calls == 0);
  rt->shutdown();
  CHECK_FALSE(called);
  CHECK(count.calls == 1);
}

TEST_CASE("import_view keeps the asynchronous import's promises or refuses",
          "[transfer][contract][view]") {
  cuda::sim_options so;
  so.devices = 2;
  testing::sim_runtime r = testing::make_sim_runtime(so);
  runtime& rt = *r.rt;
  absl::StatusOr<device_buffer> gpu0 = rt.allocate(device{device_kind::cuda, 0}, 64 * kib);
  REQUIRE(gpu0.ok());
  tensor_spec s;
  s.device = {device_kind::cuda, 0};
  s.shape = {16 * 1024};
  s.data = gpu0->data();

  SECTION("a tensor on its own GPU is a view") {
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    absl::StatusOr<tensor> t = import_view(rt, source);
    REQUIRE(t.ok());
    CHECK(t->is_view());
    CHECK(source.empty());
    t = tensor();
    CHECK(count.calls == 1);
  }
  SECTION("a tensor claiming cuda:1 whose memory lies on cuda:0 is refused") {
    s.device = {device_kind::cuda, 1};
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    require_status(import_view(rt, source).status(), absl::StatusCode::kFailedPrecondition,
                   {"cuda:1", "memory of cuda:0", "fix its DLDevice"});
    CHECK_FALSE(source.empty());
    source.reset();
    CHECK(count.calls == 1);
  }
  SECTION("a producer stream is refused: a view handed out at once cannot follow it") {
    cuda::stream_t producer = nullptr;
    r.sim->set_device(0);
    REQUIRE(r.sim->stream_create(&producer, cuda::stream_flags::non_blocking) ==
            cuda::error::success);
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.stream = reinterpret_cast<std::int64_t>(producer);
    require_status(import_view(rt, source, o).status(), absl::StatusCode::kFailedPrecondition,
                   {"cannot wait for the producer's stream", "not consumed", "import_dlpack"});
    CHECK_FALSE(source.empty());
    source.reset();
    CHECK(count.calls == 1);
    REQUIRE(r.sim->stream_destroy(producer) == cuda::error::success);
  }
  SECTION("a copy is refused, naming why") {
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    require_status(import_view(rt, source, onto(device{device_kind::cuda, 1})).status(),
                   absl::StatusCode::kFailedPrecondition,
                   {"not possible", "cross-device (cuda:0 to cuda:1)", "not consumed"});
    CHECK_FALSE(source.empty());
    source.reset();
    CHECK(count.calls == 1);
  }
  SECTION("after shutdown nothing is taken") {
    rt.shutdown();
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    require_status(import_view(rt, source).status(), absl::StatusCode::kUnavailable,
                   {"shutting down", "not consumed"});
    CHECK_FALSE(source.empty());
    source.reset();
    CHECK(count.calls == 1);
  }
  SECTION("the registry form takes host memory only") {
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    require_status(import_view(source, {}, rt.registry()).status(),
                   absl::StatusCode::kFailedPrecondition,
                   {"cuda:0", "not consumed", "import_view(runtime"});
    CHECK_FALSE(source.empty());
    source.reset();
    CHECK(count.calls == 1);
  }
}

TEST_CASE("a strided upload whose row exceeds a staging chunk is refused before consumption",
          "[transfer][contract][staging]") {
  testing::sim_runtime r =
      testing::make_sim_runtime({}, [](runtime_options& o) { o.staging_chunk_bytes = 4096; });
  // A transpose whose rows along the tile dimension hold 16 KiB each.
  const std::int64_t rows = 8;
  const std::int64_t cols = 4096;
  std::vector<float> data(static_cast<std::size_t>(rows * cols));
  tensor_spec s;
  s.shape = {rows, cols};
  s.strides = std::vector<std::int64_t>{1, rows};
  s.data = data.data();
  deleter_count count;
  managed_tensor source = make_tensor(s, count);
  absl::StatusOr<tensor> t =
      async_import_dlpack(*r.rt, source, onto(device{device_kind::cuda, 0}), asio::use_future)
          .get();
  require_status(
      t.status(), absl::StatusCode::kUnimplemented,
      {"larger than a staging chunk of 4096 bytes", "not consumed", "staging_chunk_bytes"});
  CHECK_FALSE(source.empty());
  CHECK(count.calls == 0);
  source.reset();
  CHECK(count.calls == 1);
}

TEST_CASE("every error says whether the tensor was consumed, which rule, and why a copy",
          "[transfer][contract][errors]") {
  std::unique_ptr<runtime> rt = make_runtime(2, 64 * kib);
  host_source bytes(4 * kib);
  auto check = [](const absl::Status& st, bool consumed, const char* rule, const char* reasons) {
    INFO("status: " << st.ToString());
    std::optional<import_error> why = import_error_of(st);
    REQUIRE(why);
    CHECK(why->consumed == consumed);
    CHECK(why->rule == rule);
    CHECK(why->copy_reasons == reasons);
  };
  {
    INFO("a malformed dtype: validation, not consumed");
    tensor_spec s = bytes.spec;
    s.type = dtype{2, 32, 0};
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    absl::StatusOr<tensor> t = async_import_dlpack(*rt, source, {}, asio::use_future).get();
    CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
    check(t.status(), false, "dtype", "");
    CHECK_FALSE(source.empty());
  }
  {
    INFO("copy=false when a copy is needed");
    deleter_count count;
    managed_tensor source = make_tensor(bytes.spec, count);
    import_options o = onto(second_cpu);
    o.copy = false;
    absl::StatusOr<tensor> t = async_import_dlpack(*rt, source, o, asio::use_future).get();
    check(t.status(), false, "copy", "cross_device");
    CHECK_FALSE(source.empty());
  }
  {
    INFO("cancelled after it was taken: consumed");
    host_source block(64 * kib);
    deleter_count held_count;
    managed_tensor held_source = make_tensor(block.spec, held_count);
    absl::StatusOr<tensor> held =
        async_import_dlpack(*rt, held_source, onto(second_cpu), asio::use_future).get();
    REQUIRE(held.ok());
    deleter_count count;
    managed_tensor source = make_tensor(bytes.spec, count);
    asio::cancellation_signal signal;
    std::promise<absl::StatusOr<tensor>> got;
    async_import_dlpack(*rt, source, onto(second_cpu),
                        asio::bind_cancellation_slot(signal.slot(), [&](absl::StatusOr<tensor> t) {
                          got.set_value(std::move(t));
                        }));
    signal.emit(asio::cancellation_type::terminal);
    const absl::Status st = got.get_future().get().status();
    CHECK(st.code() == absl::StatusCode::kCancelled);
    check(st, true, "", "cross_device");
    CHECK(testing::released(count));
  }
  {
    INFO("after shutdown: not consumed");
    rt->shutdown();
    deleter_count count;
    managed_tensor source = make_tensor(bytes.spec, count);
    absl::StatusOr<tensor> t =
        async_import_dlpack(*rt, source, onto(second_cpu), asio::use_future).get();
    CHECK(t.status().code() == absl::StatusCode::kUnavailable);
    check(t.status(), false, "shutdown", "");
    CHECK_FALSE(source.empty());
  }
  // A status not made by an import carries nothing.
  CHECK_FALSE(import_error_of(absl::InternalError("elsewhere")));
  CHECK_FALSE(import_error_of(absl::OkStatus()));
}

TEST_CASE("a GPU copy knows its stream, and set_stream frees it after the caller's work",
          "[transfer][contract][stream]") {
  testing::sim_runtime r = testing::make_sim_runtime();
  host_source bytes(64 * kib);
  deleter_count count;
  managed_tensor source = make_tensor(bytes.spec, count);
  absl::StatusOr<tensor> t =
      async_import_dlpack(*r.rt, source, onto(device{device_kind::cuda, 0}), asio::use_future)
          .get();
  REQUIRE(t.ok());
  CHECK(testing::released(count));
  CHECK(t->stream() != stream_no_sync);  // the import's own stream
  r.sim->set_device(0);
  cuda::stream_t caller = nullptr;
  REQUIRE(r.sim->stream_create(&caller, cuda::stream_flags::non_blocking) == cuda::error::success);
  // The caller's own work reads the copy on its stream, into pinned memory
  // (a copy to pageable memory would make the host wait for it); the host
  // has not waited for it when the tensor goes.
  void* pinned = nullptr;
  REQUIRE(r.sim->malloc_host(&pinned, 64 * kib) == cuda::error::success);
  const float* back = static_cast<const float*>(pinned);
  REQUIRE(r.sim->memcpy_async(pinned, t->data(), 64 * kib, cuda::memcpy_kind::device_to_host,
                              caller) == cuda::error::success);
  const bool handed_over = GENERATE(true, false);
  if (handed_over) {
    INFO("set_stream: the free follows the caller's read on its stream");
    REQUIRE(t->set_stream(reinterpret_cast<std::int64_t>(caller)).ok());
    CHECK(t->stream() == reinterpret_cast<std::int64_t>(caller));
    t = tensor();
  } else {
    INFO("without set_stream the free on the import's stream races the caller's read");
    t = tensor();
    testing::require_reports(*r.sim, 1, {"race: cudaFreeAsync", "cudaMemcpyAsync", "frees"});
  }
  testing::finish_stream(*r.sim, 0, caller);
  CHECK(back[4095] == 4095.0f);
  REQUIRE(r.sim->free_host(pinned) == cuda::error::success);
  REQUIRE(r.sim->stream_destroy(caller) == cuda::error::success);
}

TEST_CASE("set_stream refuses views, host copies and streams a free cannot follow",
          "[transfer][contract][stream]") {
  std::unique_ptr<runtime> rt = make_runtime(2);
  host_source bytes(4 * kib);
  deleter_count count;
  managed_tensor source = make_tensor(bytes.spec, count);
  absl::StatusOr<tensor> view = async_import_dlpack(*rt, source, {}, asio::use_future).get();
  REQUIRE(view.ok());
  CHECK(view->stream() == stream_no_sync);
  require_status(view->set_stream(7), absl::StatusCode::kFailedPrecondition,
                 {"GPU copies", "view on cpu:0", "has no stream"});
  managed_tensor other = make_tensor(bytes.spec, count);
  absl::StatusOr<tensor> copy =
      async_import_dlpack(*rt, other, onto(second_cpu), asio::use_future).get();
  REQUIRE(copy.ok());
  require_status(copy->set_stream(7), absl::StatusCode::kFailedPrecondition,
                 {"copy on cpu:1", "has no stream"});

  testing::sim_runtime r = testing::make_sim_runtime();
  managed_tensor up = make_tensor(bytes.spec, count);
  absl::StatusOr<tensor> gpu =
      async_import_dlpack(*r.rt, up, onto(device{device_kind::cuda, 0}), asio::use_future).get();
  REQUIRE(gpu.ok());
  for (const std::int64_t bad :
       {std::int64_t{0}, std::int64_t{2}, std::int64_t{-1}, std::int64_t{-5}}) {
    require_status(gpu->set_stream(bad), absl::StatusCode::kInvalidArgument,
                   {"names no stream", "stream handle"});
  }
  const std::int64_t own = gpu->stream();
  CHECK(own != stream_no_sync);
  REQUIRE(gpu->set_stream(1).ok());  // the legacy default stream
  CHECK(gpu->stream() == 1);
}

namespace {

// Threads of this process now.
std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE(
    "a runtime embedded in a server's io_context and thread pool adds only the releaser, "
    "for its imports' deleters",
    "[transfer][contract][embed]") {
  // The server's own executors, run by the server's own threads.
  asio::io_context server_io;
  auto guard = asio::make_work_guard(server_io);
  asio::thread_pool server_pool(2);
  std::mutex ids_mutex;
  std::set<std::thread::id> io_threads;
  std::vector<std::thread> runners;
  for (int i = 0; i < 2; ++i) {
    runners.emplace_back([&] {
      {
        std::lock_guard lock(ids_mutex);
        io_threads.insert(std::this_thread::get_id());
      }
      server_io.run();
    });
  }
  const std::size_t before = thread_count();
  runtime_options o;
  o.topology = process_topology::single_process(2);
  o.cuda = "off";
  o.executor = server_io.get_executor();
  o.worker_executor = server_pool.get_executor();
  o.worker_threads = 2;
  o.inline_copy_bytes = 0;  // every copy goes to the workers
  absl::StatusOr<std::unique_ptr<runtime>> created = runtime::create(o);
  REQUIRE(created.ok());
  runtime& rt = **created;
  CHECK(thread_count() == before);  // no executor, worker or other thread of dlasync's yet

  // Imports from coroutines on the server's io_context; copies of 2 MiB are
  // split among the workers, which are the server's pool.
  host_source bytes(2 << 20);
  constexpr int imports = 8;
  std::vector<deleter_count> counts(imports);
  std::atomic<int> ok{0};
  std::atomic<int> on_server_thread{0};
  std::promise<void> all_done;
  std::atomic<int> finished{0};
  for (int i = 0; i < imports; ++i) {
    asio::co_spawn(
        rt.get_executor(),
        [&, i]() -> asio::awaitable<void> {
          managed_tensor source = make_tensor(bytes.spec, counts[static_cast<std::size_t>(i)]);
          absl::StatusOr<tensor> t = co_await import_dlpack(rt, source, onto(second_cpu));
          {
            std::lock_guard lock(ids_mutex);
            if (io_threads.count(std::this_thread::get_id()) == 1) ++on_server_thread;
          }
          if (t.ok() && t->is_copy() && static_cast<const float*>(t->data())[12345] == 12345.0f) {
            ++ok;
          }
          if (++finished == imports) all_done.set_value();
        },
        asio::detached);
  }
  REQUIRE(all_done.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  CHECK(ok == imports);
  CHECK(on_server_thread == imports);  // the coroutines resumed on the server's threads
  for (deleter_count& c : counts) CHECK(testing::released(c));
  // The releaser, started by the first deleter, which no thread of the
  // server's runs: a producer's deleter that blocks holds none of them.
  CHECK(thread_count() == before + 1);

  // Shutdown waits for the runtime's tasks on the server's pool, and leaves
  // the server's executors running.
  // The handler runs on the server's io_context (use_future's would start
  // Asio's system thread pool).
  deleter_count late;
  managed_tensor source = make_tensor(bytes.spec, late);
  std::promise<absl::Status> late_status;
  async_import_dlpack(rt, source, onto(second_cpu),
                      asio::bind_executor(server_io, [&](const absl::StatusOr<tensor>& t) {
                        late_status.set_value(t.status());
                      }));
  rt.shutdown();
  CHECK(late.calls == 1);
  CHECK(late_status.get_future().get().code() != absl::StatusCode::kUnknown);
  // The releaser has stopped (a joined thread may linger a moment in the
  // kernel's list of the process's threads).
  CHECK(testing::eventually([&] { return thread_count() == before; }));
  std::promise<void> still;
  asio::post(server_io, [&] { still.set_value(); });
  CHECK(still.get_future().wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  created->reset();
  guard.reset();
  for (std::thread& t : runners) t.join();
  server_pool.join();
}

}  // namespace dlasync
