#include "dlasync/import.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "asio/bind_cancellation_slot.hpp"
#include "asio/bind_executor.hpp"
#include "asio/cancellation_signal.hpp"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/executor_work_guard.hpp"
#include "asio/experimental/awaitable_operators.hpp"
#include "asio/experimental/deferred.hpp"
#include "asio/io_context.hpp"
#include "asio/steady_timer.hpp"
#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "support/copy_budget.hpp"
#include "support/layouts.hpp"
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

import_options to_second_cpu() {
  import_options o;
  o.target = second_cpu;
  return o;
}

}  // namespace

TEST_CASE("a zero-copy import completes without suspending", "[transfer][import]") {
  std::unique_ptr<runtime> rt = make_runtime();
  matrix_source m(4, 4);
  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  asio::io_context io;
  bool done = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        absl::StatusOr<tensor> t = co_await import_dlpack(*rt, source);
        REQUIRE(t.ok());
        CHECK(t->is_view());
        CHECK(t->data() == m.data.data());
        done = true;
      },
      asio::detached);
  io.run_one();  // the spawn itself: the import needs no second turn
  CHECK(done);
  CHECK(source.empty());
  CHECK(count.calls == 1);
}

TEST_CASE("a small host copy completes without suspending, its source released",
          "[transfer][import]") {
  std::unique_ptr<runtime> rt = make_runtime();
  REQUIRE(rt->options().inline_copy_bytes >= 16 * 16 * 4);
  matrix_source m(16, 16);
  m.spec.strides = {1, 16};  // a transpose: the copy is a gather
  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  asio::io_context io;
  bool done = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        absl::StatusOr<tensor> t = co_await import_dlpack(*rt, source, to_second_cpu());
        REQUIRE(t.ok());
        CHECK(t->is_copy());
        CHECK(count.calls == 1);  // released before the result arrives
        const float* out = static_cast<const float*>(t->data());
        CHECK(out[1] == 16.0f);  // row 0 of the transpose: 0, 16, 32, ...
        CHECK(out[16] == 1.0f);
        CHECK(testing::copy_budget(*rt).in_use() == 16 * 16 * 4);
        done = true;
      },
      asio::detached);
  io.run_one();  // the spawn itself: the copy needs no second turn
  CHECK(done);
  CHECK(testing::copy_budget(*rt).in_use() == 0);  // returned with the tensor
  CHECK(rt->in_flight() == 0);
}

TEST_CASE("shutdown waits for an inline copy under way, which counts as in flight",
          "[transfer][import]") {
  // The observer holds the copy, on the calling thread, until released.
  std::mutex mutex;
  std::condition_variable changed;
  bool copying = false;
  bool go_on = false;
  std::unique_ptr<runtime> rt = make_runtime(2, 0, [&] {
    std::unique_lock lock(mutex);
    copying = true;
    changed.notify_all();
    changed.wait(lock, [&] { return go_on; });
  });
  matrix_source m(16, 16);
  m.spec.strides = {1, 16};
  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  std::optional<absl::StatusOr<tensor>> result;
  std::thread importer(
      [&] { result = async_import_dlpack(*rt, source, to_second_cpu(), asio::use_future).get(); });
  {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return copying; });
  }
  CHECK(rt->in_flight() == 1);
  std::atomic<bool> shut{false};
  std::thread closer([&] {
    rt->shutdown();
    shut = true;
  });
  // Shutdown has begun (new imports are refused) but waits for the copy.
  REQUIRE(testing::eventually([&] { return !rt->accepting(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(shut.load());
  {
    std::lock_guard lock(mutex);
    go_on = true;
  }
  changed.notify_all();
  closer.join();
  // Shutdown returned: the source's deleter has run (runtime.hpp's promise).
  CHECK(count.calls == 1);
  importer.join();
  CHECK(shut.load());
  REQUIRE(result->ok());  // began before shutdown: it completes
  CHECK(static_cast<const float*>((*result)->data())[1] == 16.0f);
  CHECK(count.calls == 1);
  CHECK(rt->in_flight() == 0);
}

TEST_CASE("small copies go to the workers when inline copies are off or the budget is queued",
          "[transfer][import]") {
  for (bool off : {true, false}) {
    runtime_options o;
    o.topology = process_topology::single_process(2);
    o.worker_threads = 2;
    o.copy_memory_budget = 4096;
    if (off) o.inline_copy_bytes = 0;
    std::unique_ptr<runtime> rt = *runtime::create(o);
    std::uint64_t ticket = 0;
    if (!off) {
      // Someone waits for the budget: a small copy must not overtake it.
      REQUIRE(testing::copy_budget(*rt).try_acquire(4096));
      ticket = testing::copy_budget(*rt).acquire(4096, [](const absl::Status&) {});
      REQUIRE(testing::copy_budget(*rt).waiting() == 1);
    }
    matrix_source m(4, 4);
    deleter_count count;
    managed_tensor source = make_tensor(m.spec, count);
    asio::io_context io;
    bool done = false;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          absl::StatusOr<tensor> t = co_await import_dlpack(*rt, source, to_second_cpu());
          CHECK(t.ok());
          done = true;
        },
        asio::detached);
    io.run_one();
    CHECK_FALSE(done);  // suspended: the copy went the asynchronous way
    if (!off) {
      CHECK(testing::copy_budget(*rt).cancel(ticket, absl::CancelledError("test")));
      testing::copy_budget(*rt).release(4096);
    }
    io.run();
    CHECK(done);
    CHECK(testing::released(count));
  }
}

TEST_CASE("a callback is not called inside the initiating function, then exactly once",
          "[transfer][import]") {
  std::unique_ptr<runtime> rt = make_runtime();
  for (bool copy : {false, true}) {
    matrix_source m(8, 8);
    deleter_count count;
    managed_tensor source = make_tensor(m.spec, count);
    asio::io_context io;
    int calls = 0;
    absl::StatusOr<tensor> result;
    async_import_dlpack(*rt, source, copy ? to_second_cpu() : import_options{},
                        asio::bind_executor(io, [&](absl::StatusOr<tensor> t) {
                          ++calls;
                          result = std::move(t);
                        }));
    CHECK(source.empty());  // consumed at the call
    CHECK(calls == 0);
    io.run();  // returns once the handler has run: the import holds work on io
    CHECK(calls == 1);
    REQUIRE(result.ok());
    CHECK(result->is_copy() == copy);
    CHECK(result->device() == (copy ? second_cpu : host_device));
    CHECK(static_cast<const float*>(result->data())[63] == 63.0f);
    result = absl::UnknownError("dropped");
    CHECK(count.calls == 1);
  }
}

TEST_CASE("use_future delivers the import", "[transfer][import]") {
  std::unique_ptr<runtime> rt = make_runtime();
  matrix_source m(16, 16);
  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  std::future<absl::StatusOr<tensor>> f =
      async_import_dlpack(*rt, source, to_second_cpu(), asio::use_future);
  absl::StatusOr<tensor> t = f.get();
  REQUIRE(t.ok());
  CHECK(t->is_copy());
  CHECK(static_cast<const float*>(t->data())[255] == 255.0f);
  CHECK(count.calls == 1);  // released as soon as the copy had read it
}

// Found by the import fuzzer: row-major strides for NULL ones overflowed on a
// size-0 tensor whose other extents are huge (UBSan: signed overflow).
TEST_CASE("size-0 tensors with huge other extents are copied and viewed without overflow",
          "[transfer][import]") {
  std::unique_ptr<runtime> rt = make_runtime();
  for (const bool copy : {true, false}) {
    INFO((copy ? "a copy" : "a view"));
    tensor_spec s;
    s.shape = {std::int64_t{1} << 60, std::int64_t{1} << 20, 0, 3};
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o = copy ? to_second_cpu() : import_options{};
    absl::StatusOr<tensor> t = async_import_dlpack(*rt, source, o, asio::use_future).get();
    REQUIRE(t.ok());
    CHECK(t->element_count() == 0);
    CHECK(t->is_copy() == copy);
    CHECK(t->strides()[3] == 1);
    CHECK(t->strides()[2] == 3);
    t = absl::UnknownError("dropped");
    CHECK(count.calls == 1);
  }
}

// Found by the import fuzzer: a size-0 tensor's byte offset is not checked,
// and data() added a wrapping offset to a pointer (UBSan: pointer overflow).
TEST_CASE("a size-0 tensor with a wrapping byte offset imports without pointer overflow",
          "[transfer][import]") {
  std::unique_ptr<runtime> rt = make_runtime();
  std::vector<float> storage(4);
  tensor_spec s;
  s.shape = {0, 4};
  s.data = storage.data() + 2;
  s.byte_offset = ~std::uint64_t{0} - 7;  // "minus 8 bytes"
  deleter_count count;
  managed_tensor source = make_tensor(s, count);
  absl::StatusOr<tensor> t = async_import_dlpack(*rt, source, {}, asio::use_future).get();
  REQUIRE(t.ok());
  CHECK(t->element_count() == 0);
  CHECK(t->data() == static_cast<void*>(storage.data()));
  t = absl::UnknownError("dropped");
  CHECK(count.calls == 1);
}

TEST_CASE("deferred imports validate and consume when launched, never before",
          "[transfer][import][asio]") {
  std::unique_ptr<runtime> rt = make_runtime();
  matrix_source m(4, 4);
  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  auto op = async_import_dlpack(*rt, source, to_second_cpu(), asio::experimental::deferred);
  // Created, not launched: the tensor is still the caller's.
  CHECK_FALSE(source.empty());
  CHECK(count.calls == 0);
  CHECK(rt->in_flight() == 0);
  asio::io_context io;
  bool done = false;
  std::move(op)(asio::bind_executor(io, [&](const absl::StatusOr<tensor>& t) {
    CHECK(t.ok());
    done = true;
  }));
  CHECK(source.empty());  // launched: consumed at the start
  io.run();
  CHECK(done);
  CHECK(count.calls == 1);

  // A deferred operation dropped unlaunched leaves the tensor with its owner.
  deleter_count dropped;
  managed_tensor other = make_tensor(m.spec, dropped);
  {
    auto never = async_import_dlpack(*rt, other, to_second_cpu(), asio::experimental::deferred);
    static_cast<void>(never);
  }
  CHECK_FALSE(other.empty());
  CHECK(dropped.calls == 0);
  other.reset();
  CHECK(dropped.calls == 1);

  // The default completion token is deferred: the same semantics.
  deleter_count defaulted;
  managed_tensor third = make_tensor(m.spec, defaulted);
  auto lazy = async_import_dlpack(*rt, third, to_second_cpu());
  CHECK_FALSE(third.empty());
  std::future<absl::StatusOr<tensor>> f = std::move(lazy)(asio::use_future);
  absl::StatusOr<tensor> t = f.get();
  REQUIRE(t.ok());
  CHECK(third.empty());
  CHECK(defaulted.calls == 1);
}

TEST_CASE("the awaitable form copies and resumes on the caller's executor", "[transfer][import]") {
  std::unique_ptr<runtime> rt = make_runtime();
  matrix_source m(32, 32);
  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  asio::io_context io;
  std::thread::id resumed_on;
  bool done = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        import_options o = to_second_cpu();
        absl::StatusOr<tensor> t = co_await import_dlpack(*rt, source, o);
        resumed_on = std::this_thread::get_id();
        REQUIRE(t.ok());
        CHECK(t->is_copy());
        CHECK(static_cast<const float*>(t->data())[1023] == 1023.0f);
        done = true;
      },
      asio::detached);
  io.run();
  CHECK(done);
  CHECK(resumed_on == std::this_thread::get_id());
  CHECK(count.calls == 1);
}

TEST_CASE("awaitable operators race an import against a timer", "[transfer][import]") {
  using namespace asio::experimental::awaitable_operators;
  // A budget of 64 bytes, taken by a held copy, makes the next import wait:
  // the timer wins and the import is cancelled.
  std::unique_ptr<runtime> rt = make_runtime(2, 64);
  matrix_source m(4, 4);  // 64 bytes: fits, but the budget is taken
  deleter_count holder_count;
  managed_tensor holder_source = make_tensor(m.spec, holder_count);
  absl::StatusOr<tensor> holder =
      async_import_dlpack(*rt, holder_source, to_second_cpu(), asio::use_future).get();
  REQUIRE(holder.ok());

  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  asio::io_context io;
  bool timer_won = false;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(io, std::chrono::milliseconds(20));
        auto winner = co_await (import_dlpack(*rt, source, to_second_cpu()) ||
                                timer.async_wait(asio::use_awaitable));
        timer_won = winner.index() == 1;
      },
      asio::detached);
  io.run();
  CHECK(timer_won);
  CHECK(testing::released(count));
  CHECK(testing::eventually([&] { return rt->in_flight() == 0; }));
}

TEST_CASE("every layout and dtype imports correctly with copy unset, true and false",
          "[transfer][import]") {
  std::unique_ptr<runtime> rt = make_runtime();
  for (const dtype type : testing::supported_dtypes()) {
    for (const testing::layout_case& c : testing::layout_cases()) {
      if (type.is_sub_byte() && !c.sub_byte_ok) continue;
      for (const std::optional<bool> copy :
           {std::optional<bool>(), std::optional<bool>(true), std::optional<bool>(false)}) {
        for (const bool cross_device : {false, true}) {
          if (cross_device && copy == false) continue;
          INFO(type.name() << ", " << c.name << ", copy "
                           << (copy ? (*copy ? "true" : "false") : "unset")
                           << (cross_device ? ", to cpu:1" : ""));
          const testing::layout_source layout(type, c);
          deleter_count count;
          managed_tensor source = make_tensor(layout.spec, count);
          import_options o;
          o.copy = copy;
          if (cross_device) o.target = second_cpu;
          absl::StatusOr<tensor> t = async_import_dlpack(*rt, source, o, asio::use_future).get();
          REQUIRE(t.ok());
          const bool copied = copy.value_or(false) || cross_device;
          CHECK(t->is_copy() == copied);
          CHECK(t->dtype() == type);
          CHECK(std::vector<std::int64_t>(t->shape().begin(), t->shape().end()) == c.shape);
          if (copied) CHECK(t->is_compact());
          CHECK(testing::same_elements(*t, layout.first(), c, type));
          CHECK(count.calls == (copied ? 1 : 0));
          t = absl::UnknownError("dropped");
          CHECK(count.calls == 1);
        }
      }
    }
  }
}

TEST_CASE("the deleter runs only after the copy has read the source", "[transfer][import]") {
  std::unique_ptr<runtime> rt = make_runtime();
  // The deleter poisons the source: a copy still reading would see it.
  for (int round = 0; round < 20; ++round) {
    auto data = std::make_shared<std::vector<float>>(1 << 20);
    for (std::size_t i = 0; i < data->size(); ++i) (*data)[i] = static_cast<float>(i % 1000);
    // A transpose: the tile kernel, split across workers.
    testing::tensor_spec s;
    s.shape = {1024, 1024};
    s.strides = std::vector<std::int64_t>{1, 1024};
    s.data = data->data();
    s.versioned = false;
    deleter_count count;
    count.on_delete = [data] { std::fill(data->begin(), data->end(), -1.0f); };
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.require_contiguous = true;
    absl::StatusOr<tensor> t = async_import_dlpack(*rt, source, o, asio::use_future).get();
    REQUIRE(t.ok());
    const auto* out = static_cast<const float*>(t->data());
    bool intact = true;
    for (std::int64_t i = 0; i < 1024 && intact; i += 7) {
      for (std::int64_t j = 0; j < 1024; j += 5) {
        intact = intact && out[i * 1024 + j] == static_cast<float>((j * 1024 + i) % 1000);
      }
    }
    CHECK(intact);
    CHECK(count.calls == 1);
  }
}

TEST_CASE("copies of parallel_copy_bytes (1 MiB) and more are split between the workers",
          "[transfer][import]") {
  // The observer runs after each stretch of a copy. It holds the first
  // thread there until a second one copies too, or 300 ms have passed: a
  // split copy then shows two threads, whichever worker takes which part.
  std::mutex mutex;
  std::condition_variable seen;
  std::set<std::thread::id> threads;
  std::unique_ptr<runtime> rt = make_runtime(2, 0, [&] {
    std::unique_lock lock(mutex);
    threads.insert(std::this_thread::get_id());
    seen.notify_all();
    seen.wait_for(lock, std::chrono::milliseconds(300), [&] { return threads.size() > 1; });
  });
  for (const auto& [rows, split] : {std::pair{1024, true}, std::pair{512, false}}) {
    INFO(rows << " KiB");
    {
      std::lock_guard lock(mutex);
      threads.clear();
    }
    matrix_source m(rows, 256);
    deleter_count count;
    managed_tensor source = make_tensor(m.spec, count);
    absl::StatusOr<tensor> t =
        async_import_dlpack(*rt, source, to_second_cpu(), asio::use_future).get();
    REQUIRE(t.ok());
    CHECK(std::memcmp(t->data(), m.data.data(), m.data.size() * sizeof(float)) == 0);
    CHECK(count.calls == 1);  // the source is released once its copy is done
    std::lock_guard lock(mutex);
    CHECK(threads.size() == (split ? 2u : 1u));
  }
}

TEST_CASE("an inline copy never waits for workers that do not come", "[transfer][import]") {
  // The workers' executor is never run while the import starts: the helpers
  // the copy posts cannot start, and the calling thread copies every slice
  // itself, inside the call.
  asio::io_context stalled;
  runtime_options o;
  o.topology = process_topology::single_process(2);
  o.worker_threads = 2;
  o.worker_executor = stalled.get_executor();
  std::unique_ptr<runtime> rt = *runtime::create(o);
  REQUIRE(rt->options().inline_copy_bytes >= (2u << 20));
  matrix_source m(2048, 256);  // 2 MiB, from parallel_copy_bytes: split into slices
  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  import_options io;
  io.copy = true;
  // The copy is done inside the call; the result comes through the future.
  std::optional<absl::StatusOr<tensor>> result =
      async_import_dlpack(*rt, source, io, asio::use_future).get();
  REQUIRE(result->ok());
  CHECK(std::memcmp((*result)->data(), m.data.data(), m.data.size() * sizeof(float)) == 0);
  CHECK(count.calls == 1);
  // The workers run from now on: the helpers find every slice taken and
  // end, and the runtime shuts down on them.
  auto work = asio::make_work_guard(stalled);
  std::thread workers([&] { stalled.run(); });
  result.reset();
  rt.reset();
  work.reset();
  workers.join();
}

TEST_CASE("10,000 concurrent imports from several threads each complete once",
          "[transfer][import][load]") {
  // Small copies inline (the default), and all through the workers.
  const std::uint64_t inline_bytes = GENERATE(std::uint64_t{64} << 10, std::uint64_t{0});
  runtime_options o;
  o.topology = process_topology::single_process(2);
  o.worker_threads = 2;
  o.inline_copy_bytes = inline_bytes;
  std::unique_ptr<runtime> rt = *runtime::create(o);
  constexpr int threads = 4;
  constexpr int per_thread = 2500;
  constexpr int total = threads * per_thread;
  std::vector<float> data(64);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  auto counts = std::make_unique<deleter_count[]>(total);
  std::atomic<int> completed{0};
  std::atomic<int> ok{0};
  std::atomic<int> copies{0};
  auto start = [&](int n, asio::io_context& io) {
    tensor_spec s;
    s.shape = {8, 8};
    s.data = data.data();
    managed_tensor source = make_tensor(s, counts[n]);
    async_import_dlpack(*rt, source, n % 2 == 0 ? import_options{} : to_second_cpu(),
                        asio::bind_executor(io, [&](absl::StatusOr<tensor> r) {
                          if (r.ok() && static_cast<const float*>(r->data())[63] == 63.0f) {
                            ++ok;
                            copies += r->is_copy();
                          }
                          ++completed;
                        }));
  };
  CHECK(testing::start_from_threads(threads, per_thread, start,
                                    [&] { return completed.load() == total; }));
  CHECK(ok == total);
  CHECK(copies == total / 2);
  CHECK(testing::eventually([&] { return rt->in_flight() == 0; }));
  // Every deleter has run once shutdown returns, and none twice.
  rt->shutdown();
  int exactly_once = 0;
  for (int n = 0; n < total; ++n) exactly_once += counts[n].calls == 1;
  CHECK(exactly_once == total);
}

TEST_CASE("cancelling an import that waits for budget releases it at once",
          "[transfer][import][cancel]") {
  std::unique_ptr<runtime> rt = make_runtime(2, 1024);
  matrix_source m(16, 16);  // 1 KiB
  deleter_count held_count;
  managed_tensor held_source = make_tensor(m.spec, held_count);
  absl::StatusOr<tensor> held =
      async_import_dlpack(*rt, held_source, to_second_cpu(), asio::use_future).get();
  REQUIRE(held.ok());
  CHECK(testing::copy_budget(*rt).in_use() == 1024);

  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  asio::io_context io;
  asio::cancellation_signal signal;
  absl::StatusOr<tensor> result;
  async_import_dlpack(*rt, source, to_second_cpu(),
                      asio::bind_cancellation_slot(
                          signal.slot(), asio::bind_executor(io, [&](absl::StatusOr<tensor> t) {
                            result = std::move(t);
                          })));
  CHECK(testing::copy_budget(*rt).waiting() == 1);
  signal.emit(asio::cancellation_type::terminal);
  io.run();
  require_status(result.status(), absl::StatusCode::kCancelled,
                 {"cancelled", "waited for copy memory budget", "released"});
  CHECK(testing::released(count));
  CHECK(testing::copy_budget(*rt).waiting() == 0);
  held = absl::UnknownError("dropped");
  CHECK(testing::copy_budget(*rt).in_use() == 0);
}

TEST_CASE("cancelling during a copy frees the partial copy and releases the source",
          "[transfer][import][cancel]") {
  std::promise<void> started;
  std::promise<void> cancelled;
  std::shared_future<void> go = cancelled.get_future().share();
  std::atomic<int> pieces{0};
  // Every copy on the workers, where it can be cancelled (an inline copy is
  // done before the import's initiation returns).
  std::unique_ptr<runtime> rt = make_runtime(
      2, 0,
      [&] {
        if (pieces++ == 0) {
          started.set_value();
          go.wait();
        }
      },
      0);
  matrix_source m(1024, 1024);  // 4 MiB in 256 KiB pieces
  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  asio::io_context io;
  asio::cancellation_signal signal;
  absl::StatusOr<tensor> result;
  import_options o = to_second_cpu();
  async_import_dlpack(*rt, source, o,
                      asio::bind_cancellation_slot(
                          signal.slot(), asio::bind_executor(io, [&](absl::StatusOr<tensor> t) {
                            result = std::move(t);
                          })));
  started.get_future().wait();
  signal.emit(asio::cancellation_type::partial);
  cancelled.set_value();
  io.run();
  require_status(result.status(), absl::StatusCode::kCancelled,
                 {"during its copy", "partial copy was freed"});
  CHECK(testing::released(count));
  CHECK(pieces.load() < 16);  // stopped early
  CHECK(testing::copy_budget(*rt).in_use() == 0);
  // The operation ends just after it delivers its handler.
  CHECK(testing::eventually([&] { return rt->in_flight() == 0; }));
}

TEST_CASE("cancelling after completion changes nothing", "[transfer][import][cancel]") {
  std::unique_ptr<runtime> rt = make_runtime();
  matrix_source m(8, 8);
  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  asio::io_context io;
  asio::cancellation_signal signal;
  absl::StatusOr<tensor> result;
  async_import_dlpack(*rt, source, to_second_cpu(),
                      asio::bind_cancellation_slot(
                          signal.slot(), asio::bind_executor(io, [&](absl::StatusOr<tensor> t) {
                            result = std::move(t);
                          })));
  io.run();
  signal.emit(asio::cancellation_type::terminal);
  REQUIRE(result.ok());
  CHECK(static_cast<const float*>(result->data())[63] == 63.0f);
  CHECK(count.calls == 1);
}

TEST_CASE("shutdown cancels imports in flight and releases every tensor",
          "[transfer][import][shutdown]") {
  std::vector<std::unique_ptr<deleter_count>> counts;
  matrix_source m(64, 64);  // 16 KiB
  asio::io_context io;
  std::atomic<int> cancelled{0};
  std::atomic<int> finished{0};
  absl::StatusOr<tensor> held;
  {
    std::unique_ptr<runtime> rt = make_runtime(2, 64 << 10);
    for (int i = 0; i < 40; ++i) {
      counts.push_back(std::make_unique<deleter_count>());
      managed_tensor source = make_tensor(m.spec, *counts.back());
      async_import_dlpack(*rt, source, to_second_cpu(),
                          asio::bind_executor(io, [&](absl::StatusOr<tensor> t) {
                            cancelled += t.status().code() == absl::StatusCode::kCancelled;
                            ++finished;
                            if (t.ok() && !held.ok()) held = std::move(t);
                          }));
    }
    // Let some copies run, then pull the runtime down with others waiting.
    io.run_one();
  }
  for (const auto& c : counts) CHECK(c->calls == 1);  // all released by the destructor
  io.run();
  CHECK(finished == 40);
  CHECK(cancelled > 0);
  deleter_count late;
  {
    std::unique_ptr<runtime> rt = make_runtime();
    rt->shutdown();
    managed_tensor source = make_tensor(m.spec, late);
    absl::StatusOr<tensor> t =
        async_import_dlpack(*rt, source, to_second_cpu(), asio::use_future).get();
    require_status(t.status(), absl::StatusCode::kUnavailable, {"shutting down", "not consumed"});
    CHECK_FALSE(source.empty());
  }
  CHECK(late.calls == 1);
}

TEST_CASE("a batch imports its members concurrently with one result each",
          "[transfer][import][batch]") {
  std::unique_ptr<runtime> rt = make_runtime();
  matrix_source m(8, 8);
  std::vector<deleter_count> counts(5);
  std::vector<managed_tensor> sources;
  tensor_spec bad = m.spec;
  bad.shape = {8, -1};
  for (int i = 0; i < 5; ++i) {
    sources.push_back(make_tensor(i == 2 ? bad : m.spec, counts[i]));
  }
  std::vector<absl::StatusOr<tensor>> results =
      async_import_dlpack_batch(*rt, sources, to_second_cpu(), asio::use_future).get();
  REQUIRE(results.size() == 5);
  for (int i = 0; i < 5; ++i) {
    INFO("member " << i);
    if (i == 2) {
      require_status(results[i].status(), absl::StatusCode::kInvalidArgument, {"shape[1] is -1"});
      CHECK_FALSE(sources[i].empty());  // refused: still the caller's
      CHECK(counts[i].calls == 0);
    } else {
      REQUIRE(results[i].ok());
      CHECK(results[i]->device() == second_cpu);
      CHECK(sources[i].empty());
      CHECK(testing::released(counts[i]));
    }
  }
  sources.clear();
  CHECK(counts[2].calls == 1);
}

TEST_CASE("the awaitable batch form and an empty batch", "[transfer][import][batch]") {
  std::unique_ptr<runtime> rt = make_runtime();
  matrix_source m(4, 4);
  deleter_count a;
  deleter_count b;
  std::vector<managed_tensor> sources;
  sources.push_back(make_tensor(m.spec, a));
  sources.push_back(make_tensor(m.spec, b));
  asio::io_context io;
  std::size_t ok = 0;
  std::size_t empty_size = 99;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto results = co_await import_dlpack_batch(*rt, sources);
        for (auto& r : results) ok += r.ok() && r->is_view();
        auto none = co_await import_dlpack_batch(*rt, std::span<managed_tensor>());
        empty_size = none.size();
      },
      asio::detached);
  io.run();
  CHECK(ok == 2);
  CHECK(empty_size == 0);
  CHECK(a.calls == 1);
  CHECK(b.calls == 1);
}

TEST_CASE("a copy larger than the whole budget is refused before it is consumed",
          "[transfer][import]") {
  std::unique_ptr<runtime> rt = make_runtime(2, 100);
  matrix_source m(8, 8);
  deleter_count count;
  managed_tensor source = make_tensor(m.spec, count);
  absl::StatusOr<tensor> t =
      async_import_dlpack(*rt, source, to_second_cpu(), asio::use_future).get();
  require_status(t.status(), absl::StatusCode::kResourceExhausted,
                 {"256 bytes", "copy memory budget of 100 bytes", "not consumed"});
  std::optional<import_error> why = import_error_of(t.status());
  REQUIRE(why);
  CHECK_FALSE(why->consumed);
  CHECK(why->rule == "budget");
  CHECK(why->copy_reasons == "cross_device");
  CHECK_FALSE(source.empty());
  CHECK(count.calls == 0);
  source.reset();
  CHECK(count.calls == 1);
}

}  // namespace dlasync
