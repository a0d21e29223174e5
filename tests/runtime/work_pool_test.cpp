// The workers' shared jobs: a helper that finished one lingers for the next
// offer and takes it without being posted; it makes way for queued tasks
// and for shutdown; a caller's executor gets a posted helper every time.
#include "runtime/src/work_pool.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "asio/executor_work_guard.hpp"
#include "asio/io_context.hpp"

#include "catch2/catch.hpp"

namespace dlasync::detail {
namespace {

using namespace std::chrono_literals;

// A job of `parts` parts, each claimed by one thread; it records who did
// them.
class parts_job final : public shared_job {
 public:
  explicit parts_job(int parts) : parts_(parts) {}

  void help() noexcept override {
    for (int i = next_.fetch_add(1); i < parts_; i = next_.fetch_add(1)) {
      {
        std::lock_guard lock(mutex_);
        threads_.insert(std::this_thread::get_id());
      }
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  int done() const { return done_.load(std::memory_order_acquire); }
  std::set<std::thread::id> threads() {
    std::lock_guard lock(mutex_);
    return threads_;
  }

 private:
  const int parts_;
  std::atomic<int> next_{0};
  std::atomic<int> done_{0};
  std::mutex mutex_;
  std::set<std::thread::id> threads_;
};

// Waits up to 10 s for `ready`; true when it held.
template <typename Fn>
bool eventually(Fn ready) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

// Three jobs offered one after another each get a posted helper, and no
// worker lingers between them.
void every_helper_posted(work_pool& pool) {
  for (int i = 0; i < 3; ++i) {
    auto job = std::make_shared<parts_job>(1);
    CHECK(pool.offer(job, 1) == 1);
    REQUIRE(eventually([&] { return job->done() == 1; }));
    pool.withdraw(job.get());
    CHECK(pool.lingering() == 0);
  }
}

TEST_CASE("a job offered while a helper lingers is taken without posting one",
          "[runtime][workers]") {
  work_pool pool(2, 60s);
  auto first = std::make_shared<parts_job>(1);
  CHECK(pool.offer(first, 1) == 1);  // nobody lingers yet: a helper is posted
  REQUIRE(eventually([&] { return first->done() == 1; }));
  pool.withdraw(first.get());
  REQUIRE(eventually([&] { return pool.lingering() == 1; }));
  const std::thread::id helper = *first->threads().begin();

  auto second = std::make_shared<parts_job>(1);
  CHECK(pool.offer(second, 1) == 0);  // the lingering worker takes it
  REQUIRE(eventually([&] { return second->done() == 1; }));
  pool.withdraw(second.get());
  CHECK(second->threads() == std::set<std::thread::id>{helper});
  // It lingers again, for the next one.
  CHECK(eventually([&] { return pool.lingering() == 1; }));
  pool.drain();
  CHECK(pool.lingering() == 0);
}

TEST_CASE("with no linger every helper is posted and none lingers", "[runtime][workers]") {
  work_pool pool(2, 0ns);
  every_helper_posted(pool);
}

TEST_CASE("a lingering worker makes way for a queued task at once", "[runtime][workers]") {
  // One thread, lingering up to a minute: a task posted meanwhile would
  // wait that long if the worker did not leave for it.
  work_pool pool(1, 60s);
  auto job = std::make_shared<parts_job>(1);
  CHECK(pool.offer(job, 1) == 1);
  REQUIRE(eventually([&] { return pool.lingering() == 1; }));
  pool.withdraw(job.get());
  std::promise<std::thread::id> ran;
  pool.post([&ran] { ran.set_value(std::this_thread::get_id()); });
  std::future<std::thread::id> done = ran.get_future();
  REQUIRE(done.wait_for(10s) == std::future_status::ready);
  CHECK(done.get() == *job->threads().begin());
  CHECK(eventually([&] { return pool.lingering() == 0; }));
}

TEST_CASE("shutdown ends lingering", "[runtime][workers]") {
  auto pool = std::make_unique<work_pool>(2, 60s);
  auto job = std::make_shared<parts_job>(1);
  pool->offer(job, 1);
  REQUIRE(eventually([&] { return pool->lingering() == 1; }));
  // drain() returns once the lingering worker left, not a minute later.
  std::future<void> drained = std::async(std::launch::async, [&] { pool->drain(); });
  CHECK(drained.wait_for(10s) == std::future_status::ready);
  drained.get();
  CHECK(pool->lingering() == 0);
}

TEST_CASE("on a caller's executor helpers are posted every time and never linger",
          "[runtime][workers]") {
  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  {
    work_pool pool(io.get_executor());
    every_helper_posted(pool);
    pool.drain();
  }
  guard.reset();
  runner.join();
}

TEST_CASE("back-to-back jobs with a short linger: every part done once", "[runtime][workers]") {
  // Lingers of a few microseconds end while offers are made, which
  // exercises the hand-over as a worker leaves. The offering thread helps
  // too, as copy_here does, and waits for its parts.
  const auto linger = GENERATE(as<std::chrono::nanoseconds>{}, 0ns, 2us, 50us, 10ms);
  INFO("linger " << linger.count() << " ns");
  work_pool pool(3, linger);
  std::vector<std::shared_ptr<parts_job>> jobs;
  for (int i = 0; i < 300; ++i) {
    auto job = std::make_shared<parts_job>(8);
    pool.offer(job, 2);
    job->help();
    pool.withdraw(job.get());
    while (job->done() != 8) std::this_thread::yield();
    jobs.push_back(std::move(job));
  }
  pool.drain();
  for (const auto& job : jobs) CHECK(job->done() == 8);
}

}  // namespace
}  // namespace dlasync::detail
