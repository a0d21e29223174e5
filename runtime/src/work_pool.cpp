#include "runtime/src/work_pool.hpp"

#include <utility>

#include <sched.h>

#include "asio/post.hpp"

namespace dlasync::detail {
namespace {

// The pool whose task this thread runs, if any.
thread_local const work_pool* running_pool = nullptr;

// A lingering worker gives its core to any other thread that wants it:
// it only spends time the machine would leave idle.
void relax() noexcept {
  sched_yield();
}

}  // namespace

work_pool::work_pool(int threads, std::chrono::nanoseconds linger)
    : own_(std::in_place, static_cast<std::size_t>(threads)), linger_(linger) {
  executor_ = own_->get_executor();
}

work_pool::work_pool(asio::any_io_executor executor) : executor_(std::move(executor)) {}

work_pool::~work_pool() {
  drain();
}

void work_pool::post(task fn) {
  {
    std::lock_guard lock(mutex_);
    ++pending_;
  }
  queued_.fetch_add(1, std::memory_order_relaxed);
  asio::post(executor_, [this, fn = std::move(fn)]() mutable {
    queued_.fetch_sub(1, std::memory_order_relaxed);
    {
      // Run and destroyed before the count drops: once it is 0, drain()
      // may return and the pool go, while this lambda is still unwinding.
      task local = std::move(fn);
      const work_pool* outer = running_pool;
      running_pool = this;
      std::move(local)();
      running_pool = outer;
    }
    std::lock_guard lock(mutex_);
    if (--pending_ == 0) idle_.notify_all();
  });
}

int work_pool::offer(const std::shared_ptr<shared_job>& job, int helpers) {
  int awake = 0;
  if (linger_.count() > 0) {
    bool published = false;
    {
      std::lock_guard lock(offer_mutex_);
      if (!offered_) {
        offered_ = job;
        published = true;
      }
    }
    if (published) {
      // Sequentially consistent with a lingering worker's leaving: either
      // it sees this offer, or this sees it gone and posts a helper.
      offers_.fetch_add(1, std::memory_order_seq_cst);
      awake = lingering_.load(std::memory_order_seq_cst);
    }
  }
  int posted = 0;
  for (int h = awake; h < helpers; ++h, ++posted) {
    post([this, job] { help_and_linger(job); });
  }
  return posted;
}

void work_pool::withdraw(const shared_job* job) {
  std::shared_ptr<shared_job> gone;  // released outside the lock
  std::lock_guard lock(offer_mutex_);
  if (offered_.get() == job) gone = std::move(offered_);
}

std::shared_ptr<shared_job> work_pool::offered() {
  std::lock_guard lock(offer_mutex_);
  return offered_;
}

void work_pool::help_and_linger(const std::shared_ptr<shared_job>& job) {
  job->help();
  if (linger_.count() <= 0) return;  // 0 on a caller's executor
  using clock = std::chrono::steady_clock;
  std::uint64_t seen = offers_.load(std::memory_order_seq_cst);
  lingering_.fetch_add(1, std::memory_order_seq_cst);
  clock::time_point until = clock::now() + linger_;
  for (;;) {
    if (const std::uint64_t now = offers_.load(std::memory_order_seq_cst); now != seen) {
      seen = now;
      if (std::shared_ptr<shared_job> next = offered()) {
        lingering_.fetch_sub(1, std::memory_order_seq_cst);
        next->help();
        lingering_.fetch_add(1, std::memory_order_seq_cst);
        until = clock::now() + linger_;
      }
      continue;
    }
    // Make way for queued tasks, and for shutdown.
    if (queued_.load(std::memory_order_relaxed) > 0 || draining_.load(std::memory_order_relaxed)) {
      break;
    }
    if (clock::now() >= until) break;
    relax();
  }
  lingering_.fetch_sub(1, std::memory_order_seq_cst);
  // An offer made as this worker left counted it as awake: take it.
  if (offers_.load(std::memory_order_seq_cst) != seen) {
    if (std::shared_ptr<shared_job> next = offered()) next->help();
  }
}

bool work_pool::running_in_this_thread() const noexcept {
  return running_pool == this;
}

void work_pool::drain() {
  draining_.store(true, std::memory_order_relaxed);
  {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return pending_ == 0; });
  }
  if (own_) own_->join();
}

}  // namespace dlasync::detail
