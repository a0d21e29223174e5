// Where a copy's source deleter runs: on the runtime's releaser, never on
// the workers or the CUDA reactor, so that a producer's deleter that blocks
// delays no other import. Deleters that block on a gate prove it with
// ordering; the bounded waits are hang guards that fail the test.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "dlasync/import.hpp"
#include "support/runtime_fixture.hpp"
#include "support/sim_runtime.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::make_tensor;
using testing::tensor_spec;
constexpr std::uint64_t kib = 1024;
// How long the tests wait for what must happen before they give up; far
// beyond any wait here, on a loaded machine and under sanitizers.
constexpr std::chrono::seconds hang_guard{10};

const device gpu0{device_kind::cuda, 0};
const device gpu1{device_kind::cuda, 1};

import_options onto(device d) {
  import_options o;
  o.target = d;
  return o;
}

// 64 KiB of floats counting up, as a 1-d tensor spec.
struct host_source {
  std::vector<float> data = std::vector<float>(64 * kib / sizeof(float));
  tensor_spec spec;
  host_source() {
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
    spec.shape = {static_cast<std::int64_t>(data.size())};
    spec.data = data.data();
  }
};

// A gate the deleters block on until the test opens it; a hang guard
// opens it too, so that a failed test still ends.
struct gate {
  std::promise<void> opened;
  std::shared_future<void> wait_for = opened.get_future().share();
  std::atomic<bool> is_open{false};
  void open() {
    if (!is_open.exchange(true)) opened.set_value();
  }
  void block() const { wait_for.wait_for(std::chrono::seconds(240)); }
};

// A deleter count whose deleter says it began, then blocks on `g`.
struct blocking_deleter {
  deleter_count count;
  std::atomic<bool> entered{false};
  explicit blocking_deleter(const gate& g) {
    count.on_delete = [this, &g] {
      entered = true;
      g.block();
    };
  }
};

bool ready(const std::future<absl::StatusOr<tensor>>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

// Polls `done` until the hang guard.
template <typename Done>
bool within_guard(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + hang_guard;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Two imports onto `blocked` whose deleters block on a gate (as many as the
// runtime has workers), then an import onto `free`: it must complete while
// both deleters are still held; each deleter then runs exactly once.
void blocked_deleters_delay_no_import(runtime& rt, device blocked, device free) {
  host_source bytes;
  gate g;
  blocking_deleter first(g);
  blocking_deleter second(g);
  // On a failure: the deleters finish, and the runtime with them, before
  // what they count goes.
  auto give_up = [&] {
    g.open();
    rt.shutdown();
  };
  managed_tensor a = make_tensor(bytes.spec, first.count);
  std::future<absl::StatusOr<tensor>> fa =
      async_import_dlpack(rt, a, onto(blocked), asio::use_future);
  const bool first_entered = within_guard([&] { return first.entered.load(); });
  if (!first_entered) give_up();
  REQUIRE(first_entered);
  managed_tensor b = make_tensor(bytes.spec, second.count);
  std::future<absl::StatusOr<tensor>> fb =
      async_import_dlpack(rt, b, onto(blocked), asio::use_future);
  // The second import is past its copy: its deleter runs (or waits to).
  const bool second_copied = within_guard([&] { return second.entered.load() || ready(fb); });
  if (!second_copied) give_up();
  REQUIRE(second_copied);

  deleter_count third_count;
  managed_tensor c = make_tensor(bytes.spec, third_count);
  std::future<absl::StatusOr<tensor>> fc = async_import_dlpack(rt, c, onto(free), asio::use_future);
  const bool completed = fc.wait_for(hang_guard) == std::future_status::ready;
  const bool held = first.count.calls == 0 && second.count.calls == 0;
  if (!completed) give_up();
  INFO("the import onto " << free.name() << " must complete while both deleters block");
  REQUIRE(completed);
  CHECK(held);
  g.open();
  absl::StatusOr<tensor> t = fc.get();
  REQUIRE(t.ok());
  CHECK(t->is_copy());
  CHECK(t->device() == free);
  if (free.kind == device_kind::cpu) CHECK(static_cast<const float*>(t->data())[1000] == 1000.0f);
  REQUIRE(fa.get().ok());
  REQUIRE(fb.get().ok());
  CHECK(testing::released(first.count));
  CHECK(testing::released(second.count));
  CHECK(testing::released(third_count));
  rt.shutdown();  // every deleter has run by now, and none runs again
  CHECK(first.count.calls == 1);
  CHECK(second.count.calls == 1);
  CHECK(third_count.calls == 1);
}

}  // namespace

TEST_CASE("deleters blocking as many as the workers delay no import onto another GPU",
          "[transfer][deleter][threads]") {
  // Two workers, and two uploads whose deleters block: with deleters on
  // the workers, a 64 KiB upload onto the other GPU once waited for them
  // (67.5 ms beside two 50 ms deleters, against 0.3 ms alone).
  cuda::sim_options so;
  so.devices = 2;
  testing::sim_runtime r =
      testing::make_sim_runtime(so, [](runtime_options& o) { o.worker_threads = 2; });
  blocked_deleters_delay_no_import(*r.rt, gpu0, gpu1);
}

TEST_CASE("deleters blocking as many as the workers delay no host copy",
          "[transfer][deleter][threads]") {
  // Host copies complete on the workers too; inline copies off, so that
  // every copy goes there.
  std::unique_ptr<runtime> rt = testing::make_runtime(2, 0, {}, 0);
  blocked_deleters_delay_no_import(*rt, testing::second_cpu, testing::second_cpu);
}

TEST_CASE("a deleter that imports another tensor and waits for it does not deadlock",
          "[transfer][deleter][threads]") {
  // One worker: a deleter run there, waiting for an import that needs a
  // worker, would wait for itself.
  runtime_options o;
  o.topology = process_topology::single_process(2);
  o.worker_threads = 1;
  o.inline_copy_bytes = 0;
  absl::StatusOr<std::unique_ptr<runtime>> created = runtime::create(o);
  REQUIRE(created.ok());
  runtime& rt = **created;
  host_source bytes;
  deleter_count inner_count;
  std::promise<absl::StatusOr<tensor>> inner_result;
  std::atomic<bool> inner_in_time{false};
  deleter_count outer_count;
  outer_count.on_delete = [&] {
    managed_tensor inner = make_tensor(bytes.spec, inner_count);
    std::future<absl::StatusOr<tensor>> f =
        async_import_dlpack(rt, inner, onto(testing::second_cpu), asio::use_future);
    if (f.wait_for(hang_guard) != std::future_status::ready) return;
    inner_in_time = true;
    inner_result.set_value(f.get());
  };
  managed_tensor outer = make_tensor(bytes.spec, outer_count);
  std::future<absl::StatusOr<tensor>> f =
      async_import_dlpack(rt, outer, onto(testing::second_cpu), asio::use_future);
  const bool outer_done = f.wait_for(hang_guard) == std::future_status::ready;
  if (!outer_done) rt.shutdown();  // the deleter ends before what it uses goes
  REQUIRE(outer_done);
  REQUIRE(f.get().ok());
  REQUIRE(testing::released(outer_count));
  INFO("the import started by the deleter must complete while the deleter waits for it");
  REQUIRE(inner_in_time);
  absl::StatusOr<tensor> inner = inner_result.get_future().get();
  REQUIRE(inner.ok());
  CHECK(static_cast<const float*>(inner->data())[7] == 7.0f);
  // Its own deleter runs after the one that started it returned.
  CHECK(testing::released(inner_count));
  rt.shutdown();
  CHECK(outer_count.calls == 1);
  CHECK(inner_count.calls == 1);
}

TEST_CASE("shutdown returns only once every deleter handed over has run",
          "[transfer][deleter][shutdown]") {
  std::unique_ptr<runtime> rt = testing::make_runtime(2, 0, {}, 0);
  host_source bytes;
  gate g;
  blocking_deleter blocked(g);
  managed_tensor source = make_tensor(bytes.spec, blocked.count);
  std::future<absl::StatusOr<tensor>> f =
      async_import_dlpack(*rt, source, onto(testing::second_cpu), asio::use_future);
  const bool entered = within_guard([&] { return blocked.entered.load(); });
  if (!entered) {
    g.open();
    rt->shutdown();
  }
  REQUIRE(entered);
  std::atomic<bool> returned{false};
  std::thread stopper([&] {
    rt->shutdown();
    returned = true;
  });
  const bool stopping = within_guard([&] { return !rt->accepting(); });
  // Shutdown has begun, and cannot be done while the deleter blocks.
  const bool returned_early = returned.load();
  g.open();
  stopper.join();
  REQUIRE(stopping);
  CHECK_FALSE(returned_early);
  CHECK(blocked.count.calls == 1);
  CHECK(f.get().ok());
}

}  // namespace dlasync
