#include "runtime/src/work_pool.hpp"

#include "asio/post.hpp"

namespace dlasync::detail {
namespace {

// The pool whose task this thread runs, if any.
thread_local const work_pool* running_pool = nullptr;

}  // namespace

work_pool::work_pool(int threads) : own_(std::in_place, static_cast<std::size_t>(threads)) {
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
  asio::post(executor_, [this, fn = std::move(fn)]() mutable {
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

bool work_pool::running_in_this_thread() const noexcept {
  return running_pool == this;
}

void work_pool::drain() {
  {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return pending_ == 0; });
  }
  if (own_) own_->join();
}

}  // namespace dlasync::detail
