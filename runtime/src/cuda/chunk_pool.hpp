// The pinned chunk pool (internal): the page-locked staging chunks that
// pipelines between pageable host memory and GPUs fill and drain. All
// imports share `count` chunks of `bytes` each, allocated on first use and
// handed out in arrival order: an import that finds none free waits for
// one instead of failing.
//
// Thread safety: all members are safe from any thread. Grants run on the
// thread that calls `take` (a chunk is free, or allocation failed) or
// `give` (a chunk came back).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/src/cuda/cuda_api.hpp"

namespace dlasync::detail {

class chunk_pool {
 public:
  using grant_fn = std::function<void(absl::StatusOr<void*>)>;

  // Chunks are pinned with GPU `home` current (a GPU the process serves):
  // cudaMallocHost works in the current device's context, and the calling
  // thread's may be a GPU of another process.
  //
  // `in_use` counts the chunks taken and not yet given back, for
  // runtime::stats, which reads it without the pool's lock and after the
  // pool is gone; null: the pool counts for itself.
  chunk_pool(cuda::api& api, std::uint64_t bytes, int count, int home,
             std::shared_ptr<std::atomic<int>> in_use = nullptr)
      : api_(api),
        bytes_(bytes),
        count_(count),
        home_(home),
        in_use_(in_use ? std::move(in_use) : std::make_shared<std::atomic<int>>(0)) {}
  chunk_pool(const chunk_pool&) = delete;
  chunk_pool& operator=(const chunk_pool&) = delete;
  // Frees every chunk, those whose free failed earlier included.
  ~chunk_pool();

  std::uint64_t chunk_bytes() const noexcept { return bytes_; }
  int chunk_count() const noexcept { return count_; }

  // Calls `granted` with a chunk once one is free, or with the error of
  // pinning the chunks (the pool then stays empty, for a retry).
  void take(grant_fn granted);

  // Returns a chunk; the oldest waiter gets it.
  void give(void* chunk);

 private:
  cuda::api& api_;
  const std::uint64_t bytes_;
  const int count_;
  const int home_;
  std::mutex mutex_;
  std::vector<void*> chunks_;
  std::vector<void*> free_;
  std::vector<void*> unfreed_;  // chunks whose free failed (a failed context)
  std::deque<grant_fn> waiters_;
  // chunks_.size() - free_.size(), kept under the lock.
  const std::shared_ptr<std::atomic<int>> in_use_;
};

}  // namespace dlasync::detail
