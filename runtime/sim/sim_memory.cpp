#include "runtime/sim/sim_api.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <shared_mutex>
#include "runtime/sim/sim_state.hpp"

namespace dlasync::cuda {

pointer_attributes sim_api::locate(const void* pointer) const {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  auto it = memory_.upper_bound(address);
  if (it == memory_.begin()) return {};
  --it;
  if (address >= it->first + it->second.bytes) return {};
  return {it->second.type, it->second.device};
}

void sim_api::run_copy(int device, int direction, std::size_t bytes, double gbps) {
  const auto slot = static_cast<std::size_t>(device) * 2;
  engine* e = direction < 2 ? engines_[slot + static_cast<std::size_t>(direction)].get() : nullptr;
  if (direction < 2 && e == nullptr) e = engines_[slot].get();
  const std::chrono::duration<double> seconds(static_cast<double>(bytes) / (gbps * 1e9));
  const auto length = std::chrono::duration_cast<std::chrono::steady_clock::duration>(seconds);
  const bool sleeps = seconds.count() * 1e6 >= options_.min_sleep_us;
  auto start = std::chrono::steady_clock::now();
  if (e != nullptr) {
    std::lock_guard lock(e->mutex);
    start = std::max(start, e->free_at);
    e->free_at = start + length;
  }
  if (sleeps) std::this_thread::sleep_until(start);
  {
    std::lock_guard lock(mutex_);
    ++active_copies_;
    stats_.peak_active_copies = std::max(stats_.peak_active_copies, active_copies_);
  }
  if (sleeps) std::this_thread::sleep_until(start + length);
  std::lock_guard lock(mutex_);
  --active_copies_;
}

error sim_api::malloc_async(void** pointer, std::size_t bytes, stream_t stream_handle) {
  if (error e = enter("cudaMallocAsync"); e != error::success) return e;
  if (!find_stream(stream_handle)) return error::invalid_resource_handle;
  return allocate(pointer, bytes, memory_type::device);
}

error sim_api::malloc_device(void** pointer, std::size_t bytes) {
  if (error e = enter("cudaMalloc"); e != error::success) return e;
  return allocate(pointer, bytes, memory_type::device);
}

error sim_api::allocate(void** pointer, std::size_t bytes, memory_type type) {
  const int device = sim_current_device;
  {
    std::lock_guard lock(mutex_);
    std::uint64_t& used = device_used_[static_cast<std::size_t>(device)];
    if (bytes > options_.memory_per_device - used) return error::memory_allocation;
    used += bytes;
  }
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
  if (type == memory_type::device && options_.device_reuse_bytes != 0) {
    std::lock_guard lock(mutex_);
    auto& reusable = reusable_[static_cast<std::size_t>(device)];
    if (auto it = reusable.find(rounded); it != reusable.end()) {
      void* p = it->second;
      reusable.erase(it);
      reusable_bytes_[static_cast<std::size_t>(device)] -= rounded;
      memory_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, device, type};
      *pointer = p;
      return error::success;
    }
  }
  void* p = std::aligned_alloc(256, rounded);
  std::lock_guard lock(mutex_);
  if (p == nullptr) {
    device_used_[static_cast<std::size_t>(device)] -= bytes;
    return error::memory_allocation;
  }
  memory_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, device, type};
  *pointer = p;
  return error::success;
}

void sim_api::release_locked(std::map<std::uintptr_t, allocation>::iterator it) {
  void* pointer = as_pointer(it->first);
  const allocation a = it->second;
  device_used_[static_cast<std::size_t>(a.device)] -= a.bytes;
  memory_.erase(it);
  const std::size_t rounded = (std::max<std::size_t>(a.bytes, 1) + 255) / 256 * 256;
  auto d = static_cast<std::size_t>(a.device);
  if (a.type == memory_type::device &&
      reusable_bytes_[d] + rounded <= options_.device_reuse_bytes) {
    reusable_[d].emplace(rounded, pointer);
    reusable_bytes_[d] += rounded;
    return;
  }
  std::free(pointer);
}

error sim_api::free_async(void* pointer, stream_t stream_handle) {
  if (error e = enter("cudaFreeAsync"); e != error::success) return e;
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!s) return error::invalid_resource_handle;
  {
    std::lock_guard lock(mutex_);
    auto it = memory_.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (it == memory_.end() || it->second.type != memory_type::device) {
      return error::invalid_value;
    }
  }
  // Freed in stream order; a failed context still returns the memory.
  enqueue_always(s, [this, pointer] {
    std::lock_guard lock(mutex_);
    release_locked(memory_.find(reinterpret_cast<std::uintptr_t>(pointer)));
  });
  return error::success;
}

error sim_api::malloc_host(void** pointer, std::size_t bytes) {
  if (error e = enter("cudaMallocHost"); e != error::success) return e;
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) return error::memory_allocation;
  // Page-locked memory is resident: touch every page now, so that copies
  // do not page-fault through it.
  std::memset(p, 0, rounded);
  std::lock_guard lock(mutex_);
  memory_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, sim_current_device, memory_type::host};
  pinned_ += bytes;
  *pointer = p;
  return error::success;
}

error sim_api::free_host(void* pointer) {
  if (error e = enter("cudaFreeHost"); e != error::success) return e;
  std::lock_guard lock(mutex_);
  auto it = memory_.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (it == memory_.end() || it->second.type != memory_type::host) return error::invalid_value;
  pinned_ -= it->second.bytes;
  memory_.erase(it);
  std::free(pointer);
  return error::success;
}

error sim_api::malloc_managed(void** pointer, std::size_t bytes) {
  if (error e = enter("cudaMallocManaged"); e != error::success) return e;
  return allocate(pointer, bytes, memory_type::managed);
}

error sim_api::free_device(void* pointer) {
  if (error e = enter("cudaFree"); e != error::success) return e;
  std::lock_guard lock(mutex_);
  auto it = memory_.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (it == memory_.end() ||
      (it->second.type != memory_type::managed && it->second.type != memory_type::device)) {
    return error::invalid_value;
  }
  release_locked(it);
  return error::success;
}

error sim_api::memcpy_async(void* dst, const void* src, std::size_t bytes, memcpy_kind kind,
                            stream_t stream_handle) {
  if (error e = enter("cudaMemcpyAsync"); e != error::success) return e;
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!s) return error::invalid_resource_handle;
  pointer_attributes from;
  pointer_attributes to;
  {
    std::lock_guard lock(mutex_);
    from = locate(src);
    to = locate(dst);
  }
  // Managed memory counts as device memory, as cudaMemcpyDefault sees it.
  const bool from_device = from.type == memory_type::device || from.type == memory_type::managed;
  const bool to_device = to.type == memory_type::device || to.type == memory_type::managed;
  const memcpy_kind actual =
      from_device ? (to_device ? memcpy_kind::device_to_device : memcpy_kind::device_to_host)
                  : (to_device ? memcpy_kind::host_to_device : memcpy_kind::host_to_host);
  if (kind != memcpy_kind::any && kind != actual) return error::invalid_value;
  const bool pageable = (to_device && from.type == memory_type::unregistered) ||
                        (from_device && to.type == memory_type::unregistered);
  int direction = 2;
  double gbps = options_.device_to_device_gbps;
  int device = s->device;
  if (actual == memcpy_kind::host_to_device) {
    direction = 0;
    gbps = options_.host_to_device_gbps;
    device = to.device;
  } else if (actual == memcpy_kind::device_to_host) {
    direction = 1;
    gbps = options_.device_to_host_gbps;
    device = from.device;
  }
  if (pageable) gbps *= 0.25;  // the driver stages pageable memory itself
  {
    std::lock_guard lock(mutex_);
    (pageable ? stats_.pageable_copies : stats_.async_copies) += 1;
    stats_.bytes_copied += bytes;
  }
  auto op = [this, dst, src, bytes, device, direction, gbps, since = epoch()] {
    std::shared_lock running(running_);
    if (failed_since(since)) return;
    run_copy(device, direction, bytes, gbps);
    std::memcpy(dst, src, bytes);
  };
  if (!pageable) {
    enqueue(s, std::move(op));
    return error::success;
  }
  // Pageable: the caller waits until the stream has reached the copy (and
  // run it, unless the context failed meanwhile).
  struct waiter {
    std::mutex mutex;
    std::condition_variable done;
    bool finished = false;
  };
  auto w = std::make_shared<waiter>();
  enqueue(s, std::move(op));
  enqueue_always(s, [w] {
    std::lock_guard lock(w->mutex);
    w->finished = true;
    w->done.notify_all();
  });
  std::unique_lock lock(w->mutex);
  w->done.wait(lock, [&] { return w->finished; });
  std::lock_guard sticky(mutex_);
  return sticky_;
}

error sim_api::pointer_get_attributes(pointer_attributes* attributes, const void* pointer) {
  if (error e = enter("cudaPointerGetAttributes"); e != error::success) return e;
  std::lock_guard lock(mutex_);
  *attributes = locate(pointer);
  return error::success;
}

}  // namespace dlasync::cuda
