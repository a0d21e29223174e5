// The CUDA backend's stream and event pools (internal).
//
// `stream_pool` holds, for each GPU, the in-order streams that imports take
// in turn and the staging streams that carry a pipeline's chunks: all
// non-blocking, created at start and destroyed at teardown.
//
// `event_pool` recycles events (without timing) per GPU: an event is
// created on the device it is recorded on, on first need, and comes back to
// the pool when its marker completed or a stream wait has captured it.
//
// Thread safety: after `create`, all members are safe from any thread.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/src/cuda/cuda_api.hpp"

namespace dlasync::detail {

class stream_pool {
 public:
  // `streams` import streams and `staging` staging streams on each GPU that
  // `served` marks (the others are left alone: no context is opened on
  // them); the error of the first call that fails. The streams created
  // before a failure are destroyed.
  static absl::StatusOr<stream_pool> create(cuda::api& api, const std::vector<bool>& served,
                                            int streams, int staging);

  stream_pool(stream_pool&&) noexcept = default;
  stream_pool& operator=(stream_pool&&) noexcept = default;
  ~stream_pool();

  int device_count() const noexcept { return static_cast<int>(devices_.size()); }
  // Import stream `index` (modulo their count) of `device`.
  cuda::stream_t stream(int device, int index) const;
  const std::vector<cuda::stream_t>& staging(int device) const;

 private:
  struct per_device {
    std::vector<cuda::stream_t> streams;
    std::vector<cuda::stream_t> staging;
  };
  explicit stream_pool(cuda::api& api) noexcept : api_(&api) {}

  cuda::api* api_;
  std::vector<per_device> devices_;
};

class event_pool {
 public:
  event_pool(cuda::api& api, int devices) : api_(api), free_(static_cast<std::size_t>(devices)) {}
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;
  // Destroys the events in the pool (those given back).
  ~event_pool();

  // An event of `device`: a recycled one, or a new one created there.
  absl::StatusOr<cuda::event_t> take(int device);
  void give(int device, cuda::event_t e);

 private:
  cuda::api& api_;
  std::mutex mutex_;
  std::vector<std::vector<cuda::event_t>> free_;
};

}  // namespace dlasync::detail
