// Example support: a pool of page-locked host blocks, as a producer that
// hands out pinned tensors keeps one (allocating page-locked memory costs far
// more than reusing it).
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "dlasync/runtime/cuda_api.hpp"

namespace dlasync::examples {

class pinned_pool {
 public:
  // Allocates with `api`, which must outlive every block taken.
  explicit pinned_pool(cuda::api& api) : state_(std::make_shared<state>(api)) {}

  // A page-locked block of `bytes`; dropping the last reference returns it
  // to the pool. ResourceExhausted (or the CUDA error) when allocation fails.
  absl::StatusOr<std::shared_ptr<void>> take(std::size_t bytes);

 private:
  struct state {
    explicit state(cuda::api& a) : api(a) {}
    ~state();
    cuda::api& api;
    std::mutex mutex;
    std::multimap<std::size_t, void*> free_blocks;
  };
  std::shared_ptr<state> state_;
};

}  // namespace dlasync::examples
