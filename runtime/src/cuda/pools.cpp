#include "runtime/src/cuda/pools.hpp"

#include "runtime/src/cuda/device_guard.hpp"
#include "runtime/src/status_macros.hpp"

namespace dlasync::detail {

absl::StatusOr<stream_pool> stream_pool::create(cuda::api& api, const std::vector<bool>& served,
                                                int streams, int staging) {
  stream_pool pool(api);
  const int devices = static_cast<int>(served.size());
  pool.devices_.resize(static_cast<std::size_t>(devices));
  for (int d = 0; d < devices; ++d) {
    if (!served[static_cast<std::size_t>(d)]) continue;
    DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api, d));
    per_device& mine = pool.devices_[static_cast<std::size_t>(d)];
    for (int i = 0; i < streams + staging; ++i) {
      cuda::stream_t s = nullptr;
      DLASYNC_CUDA_RETURN_IF_ERROR("cudaStreamCreateWithFlags", d,
                                   api.stream_create(&s, cuda::stream_flags::non_blocking));
      (i < streams ? mine.streams : mine.staging).push_back(s);
    }
  }
  return pool;
}

stream_pool::~stream_pool() {
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    if (devices_[d].streams.empty() && devices_[d].staging.empty()) continue;
    absl::StatusOr<device_guard> on = device_guard::enter(*api_, static_cast<int>(d));
    if (!on.ok()) continue;  // a failed context: its streams went with it
    for (cuda::stream_t s : devices_[d].streams) (void)api_->stream_destroy(s);
    for (cuda::stream_t s : devices_[d].staging) (void)api_->stream_destroy(s);
  }
}

cuda::stream_t stream_pool::stream(int device, int index) const {
  const std::vector<cuda::stream_t>& streams = devices_[static_cast<std::size_t>(device)].streams;
  return streams[static_cast<std::size_t>(index) % streams.size()];
}

const std::vector<cuda::stream_t>& stream_pool::staging(int device) const {
  return devices_[static_cast<std::size_t>(device)].staging;
}

event_pool::~event_pool() {
  for (std::size_t d = 0; d < free_.size(); ++d) {
    if (free_[d].empty()) continue;
    absl::StatusOr<device_guard> on = device_guard::enter(api_, static_cast<int>(d));
    if (!on.ok()) continue;
    for (cuda::event_t e : free_[d]) (void)api_.event_destroy(e);
  }
}

absl::StatusOr<cuda::event_t> event_pool::take(int device) {
  {
    std::lock_guard lock(mutex_);
    std::vector<cuda::event_t>& free = free_[static_cast<std::size_t>(device)];
    if (!free.empty()) {
      cuda::event_t e = free.back();
      free.pop_back();
      return e;
    }
  }
  DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api_, device));
  cuda::event_t e = nullptr;
  DLASYNC_CUDA_RETURN_IF_ERROR("cudaEventCreateWithFlags", device, api_.event_create(&e));
  return e;
}

void event_pool::give(int device, cuda::event_t e) {
  std::lock_guard lock(mutex_);
  free_[static_cast<std::size_t>(device)].push_back(e);
}

}  // namespace dlasync::detail
