#include "runtime/sim/sim_api.hpp"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "runtime/sim/sim_state.hpp"

namespace dlasync::cuda {

sim_api::sim_api(sim_options options)
    : options_(options),
      device_used_(static_cast<std::size_t>(options.devices), 0),
      reusable_(static_cast<std::size_t>(options.devices)),
      reusable_bytes_(static_cast<std::size_t>(options.devices), 0),
      peer_enabled_(static_cast<std::size_t>(options.devices),
                    std::vector<bool>(static_cast<std::size_t>(options.devices), false)) {
  const int per_device = std::max(1, std::min(options_.copy_engines, 2));
  for (int i = 0; i < options_.devices * 2; ++i) {
    // With one engine both directions share it.
    if (per_device == 1 && i % 2 == 1) {
      engines_.push_back(nullptr);
    } else {
      engines_.push_back(std::make_unique<engine>());
    }
  }
  for (int d = 0; d < options_.devices; ++d) {
    auto s = std::make_shared<stream>();
    s->device = d;
    start_worker(*s);
    default_streams_.push_back(std::move(s));
  }
}

sim_api::~sim_api() {
  // Streams finish their queues, then their threads end.
  std::unordered_map<void*, std::shared_ptr<stream>> streams;
  {
    std::lock_guard lock(mutex_);
    streams.swap(streams_);
  }
  streams.clear();
  default_streams_.clear();
  for (auto& [address, a] : memory_) std::free(as_pointer(address));
  for (auto& blocks : reusable_) {
    for (auto& [size, pointer] : blocks) std::free(pointer);
  }
}

sim_stats sim_api::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::uint64_t sim_api::device_bytes_in_use(int device) const {
  std::lock_guard lock(mutex_);
  return device_used_.at(static_cast<std::size_t>(device));
}

std::uint64_t sim_api::host_bytes_pinned() const {
  std::lock_guard lock(mutex_);
  return pinned_;
}

error sim_api::get_device_count(int* count) {
  if (error e = enter("cudaGetDeviceCount"); e != error::success) return e;
  *count = options_.devices;
  return error::success;
}

error sim_api::set_device(int device) {
  if (error e = enter("cudaSetDevice"); e != error::success) return e;
  if (device < 0 || device >= options_.devices) return error::invalid_device;
  sim_current_device = device;
  return error::success;
}

error sim_api::get_device(int* device) {
  if (error e = enter("cudaGetDevice"); e != error::success) return e;
  *device = sim_current_device;
  return error::success;
}

error sim_api::get_device_properties(device_properties* properties, int device) {
  if (error e = enter("cudaGetDeviceProperties"); e != error::success) return e;
  if (device < 0 || device >= options_.devices) return error::invalid_device;
  properties->name = absl::StrCat("dlasync simulated GPU ", device);
  properties->total_memory = options_.memory_per_device;
  properties->async_engine_count = options_.copy_engines;
  properties->concurrent_managed_access = false;
  properties->major = 9;
  properties->minor = 0;
  return error::success;
}

error sim_api::device_can_access_peer(int* can, int device, int peer) {
  if (error e = enter("cudaDeviceCanAccessPeer"); e != error::success) return e;
  if (device < 0 || device >= options_.devices || peer < 0 || peer >= options_.devices) {
    return error::invalid_device;
  }
  *can = device != peer ? 1 : 0;
  return error::success;
}

error sim_api::device_enable_peer_access(int peer) {
  if (error e = enter("cudaDeviceEnablePeerAccess"); e != error::success) return e;
  if (peer < 0 || peer >= options_.devices || peer == sim_current_device)
    return error::invalid_device;
  std::lock_guard lock(mutex_);
  peer_enabled_[static_cast<std::size_t>(sim_current_device)][static_cast<std::size_t>(peer)] =
      true;
  return error::success;
}

}  // namespace dlasync::cuda
