// Example support: a pool of page-locked host blocks, as a producer that
// hands out pinned tensors keeps one (allocating page-locked memory costs far
// more than reusing it). Blocks come from runtime::allocate on cuda_host:0.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "dlasync/dlasync.hpp"

namespace dlasync::examples {

class pinned_pool {
 public:
  // Allocates with `rt`, which must outlive every block taken.
  explicit pinned_pool(runtime& rt) : state_(std::make_shared<state>(rt)) {}

  // A page-locked block of `bytes`; dropping the last reference returns it
  // to the pool. The allocation's error when it fails.
  absl::StatusOr<std::shared_ptr<void>> take(std::size_t bytes);

 private:
  struct state {
    explicit state(runtime& r) : rt(r) {}
    runtime& rt;
    std::mutex mutex;
    std::multimap<std::size_t, device_buffer> free_blocks;
  };
  std::shared_ptr<state> state_;
};

}  // namespace dlasync::examples
