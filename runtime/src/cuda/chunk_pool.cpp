#include "runtime/src/cuda/chunk_pool.hpp"

#include "runtime/src/cuda/device_guard.hpp"

namespace dlasync::detail {

chunk_pool::~chunk_pool() {
  for (void* chunk : chunks_) (void)api_.free_host(chunk);
  for (void* chunk : unfreed_) (void)api_.free_host(chunk);
}

void chunk_pool::take(grant_fn granted) {
  absl::Status failure;
  void* chunk = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (chunks_.empty()) {
      // Pinned on first use; a failure leaves the pool empty for a retry.
      absl::StatusOr<device_guard> on = device_guard::enter(api_, home_);
      if (!on.ok()) failure = on.status();
      for (int i = 0; i < count_ && failure.ok(); ++i) {
        void* p = nullptr;
        if (const cuda::error err = api_.malloc_host(&p, bytes_); err != cuda::error::success) {
          failure = cuda::to_status(err, "cudaMallocHost", -1);
        } else {
          chunks_.push_back(p);
        }
      }
      if (!failure.ok()) {
        // A chunk whose free fails too (a failed context) is freed again
        // at teardown rather than lost.
        for (void* p : chunks_) {
          if (api_.free_host(p) != cuda::error::success) unfreed_.push_back(p);
        }
        chunks_.clear();
      } else {
        free_ = chunks_;
      }
    }
    if (failure.ok()) {
      if (free_.empty()) {
        waiters_.push_back(std::move(granted));
        return;
      }
      chunk = free_.back();
      free_.pop_back();
      in_use_->store(in_use_->load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
  }
  if (!failure.ok()) return granted(failure);
  granted(chunk);
}

void chunk_pool::give(void* chunk) {
  // The simulation checks that no copy still reads or writes the chunk.
  api_.host_access(chunk, bytes_, cuda::host_use::release, "a staging chunk goes back to the pool");
  grant_fn next;
  {
    std::lock_guard lock(mutex_);
    if (waiters_.empty()) {
      free_.push_back(chunk);
      in_use_->store(in_use_->load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
      return;
    }
    next = std::move(waiters_.front());
    waiters_.pop_front();
  }
  next(chunk);
}

}  // namespace dlasync::detail
