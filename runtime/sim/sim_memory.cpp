#include "runtime/sim/sim_api.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <shared_mutex>

#include "absl/strings/str_cat.h"
#include "runtime/sim/sim_site.hpp"
#include "runtime/sim/sim_state.hpp"

namespace dlasync::cuda {
namespace {

std::size_t rounded_size(std::size_t bytes, std::size_t to) {
  return (std::max<std::size_t>(bytes, 1) + to - 1) / to * to;
}

const char* kind_name(memcpy_kind k) {
  switch (k) {
    case memcpy_kind::host_to_host: return "host to host";
    case memcpy_kind::host_to_device: return "host to device";
    case memcpy_kind::device_to_host: return "device to host";
    case memcpy_kind::device_to_device: return "device to device";
    case memcpy_kind::any: return "default";
  }
  return "unknown";
}

const char* memory_name(memory_type t) {
  switch (t) {
    case memory_type::unregistered: return "pageable host memory";
    case memory_type::host: return "page-locked host memory";
    case memory_type::device: return "device memory";
    case memory_type::managed: return "managed memory";
  }
  return "memory";
}

bool on_device(memory_type t) {
  return t == memory_type::device || t == memory_type::managed;
}

}  // namespace

sim_api::located sim_api::locate(const void* pointer) const {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  auto it = memory_.upper_bound(address);
  if (it == memory_.begin()) return {};
  --it;
  if (address >= it->first + std::max<std::size_t>(it->second.bytes, 1)) return {};
  located out;
  out.known = true;
  out.info = it->second;
  out.base = it->first;
  if (it->second.status != state::quarantined) {
    out.attributes = {it->second.type, it->second.device};
  }
  return out;
}

void sim_api::run_copy(int device, int direction, std::size_t bytes, double gbps) {
  const auto slot = static_cast<std::size_t>(device) * 2;
  engine* e = direction < 2 ? engines_[slot + static_cast<std::size_t>(direction)].get() : nullptr;
  if (direction < 2 && e == nullptr) e = engines_[slot].get();
  const double us = std::max(static_cast<double>(bytes) / (gbps * 1e3), options_.min_op_us);
  const auto length = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::micro>(us));
  const bool sleeps = us >= options_.min_sleep_us || options_.min_op_us > 0;
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

error sim_api::malloc_async(void** pointer, std::size_t bytes, stream_t stream_handle, site where) {
  if (error e = enter("cudaMallocAsync"); e != error::success) return failed(e);
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!s) {
    return unknown_handle("cudaMallocAsync", "stream", where);
  }
  // From the pool of the stream's device, whichever device is current.
  open_context(s->device);
  if (error e = allocate(pointer, bytes, memory_type::device, s->device, true);
      e != error::success) {
    return failed(e);
  }
  const auto base = reinterpret_cast<std::uintptr_t>(*pointer);
  const access allocated{base, std::max<std::uint64_t>(bytes, 1), access_kind::allocate, base};
  enqueue(s, {}, {&allocated, 1},
          {absl::StrCat("cudaMallocAsync (", bytes, " bytes)"), site_name(where)});
  return error::success;
}

error sim_api::malloc_device(void** pointer, std::size_t bytes) {
  if (error e = enter("cudaMalloc"); e != error::success) return failed(e);
  open_context(sim_current_device);
  return failed(allocate(pointer, bytes, memory_type::device, sim_current_device, false));
}

error sim_api::malloc_managed(void** pointer, std::size_t bytes) {
  if (error e = enter("cudaMallocManaged"); e != error::success) return failed(e);
  open_context(sim_current_device);
  return failed(allocate(pointer, bytes, memory_type::managed, sim_current_device, false));
}

error sim_api::allocate(void** pointer, std::size_t bytes, memory_type type, int device,
                        bool pool) {
  {
    std::lock_guard lock(mutex_);
    std::uint64_t& used = device_used_[static_cast<std::size_t>(device)];
    if (bytes > options_.memory_per_device - used) return error::memory_allocation;
    used += bytes;
  }
  const std::size_t rounded = rounded_size(bytes, 256);
  void* p = nullptr;
  if (type == memory_type::device && options_.device_reuse_bytes != 0) {
    std::lock_guard lock(mutex_);
    auto& reusable = reusable_[static_cast<std::size_t>(device)];
    if (auto it = reusable.find(rounded); it != reusable.end()) {
      p = it->second;
      reusable.erase(it);
      reusable_bytes_[static_cast<std::size_t>(device)] -= rounded;
    }
  }
  if (p == nullptr) p = std::aligned_alloc(256, rounded);
  if (p == nullptr) {
    std::lock_guard lock(mutex_);
    device_used_[static_cast<std::size_t>(device)] -= bytes;
    return error::memory_allocation;
  }
  // Memory at this address starts a new history.
  checker_.forget(reinterpret_cast<std::uintptr_t>(p));
  std::lock_guard lock(mutex_);
  memory_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, device, type, pool, state::live};
  *pointer = p;
  return error::success;
}

void sim_api::release_locked(std::map<std::uintptr_t, allocation>::iterator it) {
  const std::uintptr_t address = it->first;
  const allocation a = it->second;
  const auto d = static_cast<std::size_t>(a.device);
  device_used_[d] -= a.bytes;
  const std::size_t rounded = rounded_size(a.bytes, 256);
  if (a.type == memory_type::device &&
      reusable_bytes_[d] + rounded <= options_.device_reuse_bytes) {
    memory_.erase(it);
    reusable_[d].emplace(rounded, as_pointer(address));
    reusable_bytes_[d] += rounded;
    return;
  }
  // Quarantined: later uses are reported instead of reading reused memory.
  it->second.status = state::quarantined;
  quarantine_.emplace_back(address, rounded);
  quarantined_bytes_ += rounded;
  while (quarantined_bytes_ > options_.quarantine_bytes && !quarantine_.empty()) {
    const auto [old, size] = quarantine_.front();
    quarantine_.pop_front();
    quarantined_bytes_ -= size;
    memory_.erase(old);
    std::free(as_pointer(old));
    checker_.forget(old);
  }
}

error sim_api::free_async(void* pointer, stream_t stream_handle, site where) {
  if (error e = enter("cudaFreeAsync"); e != error::success) return failed(e);
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!s) {
    return unknown_handle("cudaFreeAsync", "stream", where);
  }
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  std::string wrong;
  std::size_t bytes = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = memory_.find(address);
    if (it == memory_.end()) {
      wrong = locate(pointer).known
                  ? "the pointer lies inside an allocation, not at its start"
                  : "the pointer was never allocated (or its memory left the quarantine)";
    } else if (it->second.status != state::live) {
      wrong = "double free: the memory was freed before";
    } else if (it->second.type != memory_type::device) {
      wrong = absl::StrCat("the pointer is ", memory_name(it->second.type),
                           ", which cudaFreeAsync does not free");
    } else {
      it->second.status = state::free_pending;
      bytes = it->second.bytes;
    }
  }
  if (!wrong.empty()) {
    return refuse(error::invalid_value, "cudaFreeAsync",
                  absl::StrCat(wrong, " (", absl::Hex(address), ")"), where);
  }
  const access freed{address, std::max<std::uint64_t>(bytes, 1), access_kind::free, address};
  // Freed in stream order; a failed context still returns the memory.
  enqueue(
      s,
      [this, address] {
        std::lock_guard lock(mutex_);
        if (auto it = memory_.find(address); it != memory_.end()) release_locked(it);
      },
      {&freed, 1}, {absl::StrCat("cudaFreeAsync (", bytes, " bytes)"), site_name(where)}, true);
  return error::success;
}

error sim_api::malloc_host(void** pointer, std::size_t bytes) {
  if (error e = enter("cudaMallocHost"); e != error::success) return failed(e);
  open_context(sim_current_device);
  const std::size_t rounded = rounded_size(bytes, 64);
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) return failed(error::memory_allocation);
  // Page-locked memory is resident: touch every page now, so that copies
  // do not page-fault through it.
  std::memset(p, 0, rounded);
  checker_.forget(reinterpret_cast<std::uintptr_t>(p));
  std::lock_guard lock(mutex_);
  memory_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, sim_current_device, memory_type::host};
  pinned_ += bytes;
  *pointer = p;
  return error::success;
}

error sim_api::free_host(void* pointer) {
  if (error e = enter("cudaFreeHost"); e != error::success) return failed(e);
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  std::size_t bytes = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = memory_.find(address);
    if (it == memory_.end() || it->second.type != memory_type::host) {
      bytes = 0;
    } else {
      bytes = std::max<std::size_t>(it->second.bytes, 1);
    }
  }
  if (bytes == 0) {
    return refuse(error::invalid_value, "cudaFreeHost",
                  absl::StrCat("the pointer ", absl::Hex(address),
                               " is no page-locked allocation (never allocated, freed before, "
                               "or not the start of one)"),
                  site::current());
  }
  // cudaFreeHost is not documented to wait for the device: work that may
  // still use the memory must be known complete first.
  host_access(pointer, bytes, host_use::release, "cudaFreeHost", 0, site::current());
  std::lock_guard lock(mutex_);
  auto it = memory_.find(address);
  if (it == memory_.end()) return failed(error::invalid_value);
  pinned_ -= it->second.bytes;
  memory_.erase(it);
  std::free(pointer);
  return error::success;
}

error sim_api::free_device(void* pointer) {
  if (error e = enter("cudaFree"); e != error::success) return failed(e);
  if (pointer == nullptr) return error::success;
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  std::string wrong;
  bool pool = false;
  std::size_t bytes = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = memory_.find(address);
    if (it == memory_.end()) {
      wrong = "the pointer was never allocated (or not at the start of an allocation)";
    } else if (it->second.status != state::live) {
      wrong = "double free: the memory was freed before";
    } else if (!on_device(it->second.type)) {
      wrong = absl::StrCat("the pointer is ", memory_name(it->second.type),
                           "; free it with cudaFreeHost");
    } else {
      it->second.status = state::free_pending;
      pool = it->second.pool;
      bytes = std::max<std::size_t>(it->second.bytes, 1);
    }
  }
  if (!wrong.empty()) {
    return refuse(error::invalid_value, "cudaFree",
                  absl::StrCat(wrong, " (", absl::Hex(address), ")"), site::current());
  }
  if (pool) {
    // No implicit synchronization for stream-ordered memory.
    host_access(pointer, bytes, host_use::release, "cudaFree of stream-ordered memory", 0,
                site::current());
  } else {
    // "cudaFree causes the GPU to synchronize across all executing CUDA
    // streams" (Programming Guide, Stream Ordered Memory Allocator).
    synchronize_all();
  }
  std::lock_guard lock(mutex_);
  if (auto it = memory_.find(address); it != memory_.end()) release_locked(it);
  return error::success;
}

error sim_api::check_reach(const located& where, int device, const char* call, const char* role,
                           site at) {
  const allocation* a = &where.info;
  if (!where.known || !a->pool || a->device == device) return error::success;
  bool granted = false;
  {
    std::lock_guard lock(mutex_);
    granted = pool_access_[static_cast<std::size_t>(a->device)][static_cast<std::size_t>(device)];
  }
  if (granted) return error::success;
  return refuse(error::invalid_value, call,
                absl::StrCat("its ", role, " is stream-ordered pool memory of cuda:", a->device,
                             ", reached from cuda:", device,
                             " without cudaMemPoolSetAccess (pool memory does not follow peer "
                             "access; a GPU may fault or refuse)"),
                at);
}

error sim_api::memcpy_async(void* dst, const void* src, std::size_t bytes, memcpy_kind kind,
                            stream_t stream_handle, site where) {
  if (error e = enter("cudaMemcpyAsync"); e != error::success) return failed(e);
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!s) {
    return unknown_handle("cudaMemcpyAsync", "stream", where);
  }
  located from;
  located to;
  {
    std::lock_guard lock(mutex_);
    from = locate(src);
    to = locate(dst);
  }
  for (const auto& [operand, role] : {std::pair{&from, "source"}, std::pair{&to, "destination"}}) {
    if (operand->known && operand->info.status != state::live) {
      return refuse(
          error::invalid_value, "cudaMemcpyAsync",
          absl::StrCat("use after free: its ", role, " ",
                       absl::Hex(operand == &from ? reinterpret_cast<std::uintptr_t>(src)
                                                  : reinterpret_cast<std::uintptr_t>(dst)),
                       " is device memory whose free was already ordered"),
          where);
    }
  }
  const bool from_device = on_device(from.attributes.type);
  const bool to_device = on_device(to.attributes.type);
  const memcpy_kind actual =
      from_device ? (to_device ? memcpy_kind::device_to_device : memcpy_kind::device_to_host)
                  : (to_device ? memcpy_kind::host_to_device : memcpy_kind::host_to_host);
  if (kind != memcpy_kind::any && kind != actual) {
    return refuse(error::invalid_value, "cudaMemcpyAsync",
                  absl::StrCat("the kind says ", kind_name(kind), " but the pointers say ",
                               kind_name(actual), " (", memory_name(from.attributes.type), " to ",
                               memory_name(to.attributes.type),
                               "): undefined behaviour on a GPU; pass the right kind or the "
                               "default kind"),
                  where);
  }
  if ((from.known && from.info.pool) || (to.known && to.info.pool)) {
    if (sim_current_device != s->device) {
      return refuse(error::invalid_value, "cudaMemcpyAsync",
                    absl::StrCat("it copies stream-ordered pool memory on ", s->name,
                                 " while cuda:", sim_current_device,
                                 " is current; make the stream's device current (Programming "
                                 "Guide: cudaMemcpyAsync current context/device sensitivity)"),
                    where);
    }
    for (const auto& [operand, role] :
         {std::pair{&from, "source"}, std::pair{&to, "destination"}}) {
      if (error e = check_reach(*operand, s->device, "cudaMemcpyAsync", role, where);
          e != error::success) {
        return e;
      }
    }
  }
  const bool pageable = (to_device && !from.known) || (from_device && !to.known);
  int direction = 2;
  double gbps = options_.device_to_device_gbps;
  int device = s->device;
  if (actual == memcpy_kind::host_to_device) {
    direction = 0;
    gbps = options_.host_to_device_gbps;
    device = to.attributes.device;
  } else if (actual == memcpy_kind::device_to_host) {
    direction = 1;
    gbps = options_.device_to_host_gbps;
    device = from.attributes.device;
  }
  if (pageable) gbps *= 0.25;  // the driver stages pageable memory itself
  {
    std::lock_guard lock(mutex_);
    (pageable ? stats_.pageable_copies : stats_.async_copies) += 1;
    stats_.bytes_copied += bytes;
  }
  std::vector<access> accesses;
  if (from.known) {
    accesses.push_back(
        {reinterpret_cast<std::uintptr_t>(src), bytes, access_kind::read, from.base});
  }
  if (to.known) {
    accesses.push_back({reinterpret_cast<std::uintptr_t>(dst), bytes, access_kind::write, to.base});
  }
  auto op = [this, dst, src, bytes, device, direction, gbps, since = epoch()] {
    std::shared_lock running(running_);
    if (failed_since(since)) return;
    run_copy(device, direction, bytes, gbps);
    std::memcpy(dst, src, bytes);
  };
  const op_label label{absl::StrCat("cudaMemcpyAsync (", kind_name(actual), ", ", bytes, " bytes)"),
                       site_name(where)};
  if (!pageable) {
    enqueue(s, std::move(op), accesses, label);
    return error::success;
  }
  // Pageable: the caller waits until the stream has reached the copy (and
  // run it, unless the context failed meanwhile); the host then knows what
  // the stream ran.
  enqueue(s, std::move(op), accesses, label);
  drain_stream(s);
  return failed(sticky_error());
}

error sim_api::pointer_get_attributes(pointer_attributes* attributes, const void* pointer) {
  if (error e = enter("cudaPointerGetAttributes"); e != error::success) return failed(e);
  std::lock_guard lock(mutex_);
  *attributes = locate(pointer).attributes;
  return error::success;
}

}  // namespace dlasync::cuda
