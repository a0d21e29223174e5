#include "py_release.hpp"

#include <Python.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace dlasync::python {
namespace {

class releaser {
 public:
  void post(absl::AnyInvocable<void() &&> fn) {
    std::unique_lock lock(mutex_);
    if (closed_) {
      lock.unlock();
      skipped_.fetch_add(1, std::memory_order_relaxed);
      return;  // `fn` is destroyed here without being called
    }
    queue_.push_back(std::move(fn));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    wake_.notify_one();
  }

  void close() {
    std::thread joined;
    {
      std::lock_guard lock(mutex_);
      if (closed_) return;
      closed_ = true;
      joined = std::move(thread_);
    }
    wake_.notify_all();
    if (joined.joinable()) {
      Py_BEGIN_ALLOW_THREADS joined.join();
      Py_END_ALLOW_THREADS
    }
    run_queued();  // posted before close and not yet taken: the GIL is ours
  }

  std::uint64_t skipped() const noexcept { return skipped_.load(std::memory_order_relaxed); }

 private:
  void run() {
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return closed_ || !queue_.empty(); });
        if (queue_.empty()) return;  // closed and drained
      }
      PyGILState_STATE gil = PyGILState_Ensure();
      run_queued();
      PyGILState_Release(gil);
    }
  }

  // With the GIL held.
  void run_queued() {
    for (;;) {
      std::vector<absl::AnyInvocable<void() &&>> batch;
      {
        std::lock_guard lock(mutex_);
        batch.swap(queue_);
      }
      if (batch.empty()) return;
      for (auto& fn : batch) std::move(fn)();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<absl::AnyInvocable<void() &&>> queue_;
  std::thread thread_;
  bool closed_ = false;
  std::atomic<std::uint64_t> skipped_{0};
};

releaser& the_releaser() {
  // Never destroyed: deleters may arrive while static objects are torn down.
  static releaser* const r = new releaser();
  return *r;
}

}  // namespace

void release_with_gil(absl::AnyInvocable<void() &&> fn) {
  if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) {
    std::move(fn)();
    return;
  }
  the_releaser().post(std::move(fn));
}

void close_releaser() {
  the_releaser().close();
}

std::uint64_t skipped_releases() noexcept {
  return the_releaser().skipped();
}

py_ref::py_ref(void* o) noexcept : obj_(o) {
  Py_XINCREF(static_cast<PyObject*>(o));
}

py_ref& py_ref::operator=(py_ref&& other) noexcept {
  if (this != &other) {
    reset();
    obj_ = std::exchange(other.obj_, nullptr);
  }
  return *this;
}

void py_ref::reset() noexcept {
  PyObject* o = static_cast<PyObject*>(std::exchange(obj_, nullptr));
  if (o == nullptr) return;
  release_with_gil([o] { Py_DECREF(o); });
}

}  // namespace dlasync::python
