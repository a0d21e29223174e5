#include "dlasync/runtime/sim_cuda.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <shared_mutex>
#include <thread>

#include "absl/strings/str_cat.h"

namespace dlasync::cuda {
namespace {

thread_local int current_device = 0;

// DLPack's and cudart's special stream handles.
bool is_legacy_default(stream_t s) {
  return s == nullptr || s == reinterpret_cast<stream_t>(1) || s == reinterpret_cast<stream_t>(2);
}

}  // namespace

// An in-order queue with its own thread.
struct sim_api::stream {
  int device = 0;
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<std::function<void()>> queue;
  bool stop = false;
  std::thread worker;

  ~stream() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    wake.notify_all();
    if (worker.joinable()) worker.join();
  }
};

struct sim_api::event {
  int device = 0;
  std::mutex mutex;
  std::condition_variable done;
  // Records are numbered; a record is complete when its stream reached it.
  // Records on different streams may complete out of order: a wait holds
  // for the record it saw, whatever later ones do (as in CUDA).
  std::uint64_t recorded = 0;
  std::set<std::uint64_t> pending;

  bool complete(std::uint64_t generation) const { return !pending.contains(generation); }
};

// A copy engine: one copy at a time.
// A copy engine: a timeline of the link. Each copy reserves the next free
// slot of bytes / bandwidth, in arrival order, then sleeps until its slot
// ends. Slots follow each other on the timeline, not on the moments the
// sleeps really end, so that the oversleeping of one copy does not slow the
// link down.
struct sim_api::engine {
  std::mutex mutex;
  std::chrono::steady_clock::time_point free_at{};
};

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
  for (auto& [address, a] : memory_) std::free(reinterpret_cast<void*>(address));
  for (auto& blocks : reusable_) {
    for (auto& [size, pointer] : blocks) std::free(pointer);
  }
}

void sim_api::start_worker(stream& s) {
  s.worker = std::thread([this, &s] {
    std::unique_lock lock(s.mutex);
    while (true) {
      s.wake.wait(lock, [&s] { return s.stop || !s.queue.empty(); });
      if (s.queue.empty()) return;
      std::function<void()> op = std::move(s.queue.front());
      s.queue.pop_front();
      lock.unlock();
      stream_busy(1);
      op();
      stream_busy(-1);
      lock.lock();
    }
  });
}

void sim_api::stream_busy(int delta) {
  std::lock_guard lock(mutex_);
  busy_streams_ += delta;
  stats_.peak_busy_streams = std::max(stats_.peak_busy_streams, busy_streams_);
}

void sim_api::fail_call(const std::string& call, int nth, error e, bool sticky) {
  std::lock_guard lock(mutex_);
  call_faults_[call].push_back({call_counts_[call] + static_cast<std::uint64_t>(nth), e, sticky});
}

void sim_api::fail_nth_call(std::uint64_t k, error e, bool sticky) {
  std::lock_guard lock(mutex_);
  nth_faults_.push_back({calls_.load() + k, e, sticky});
}

void sim_api::make_sticky(error e) {
  {
    std::lock_guard lock(mutex_);
    sticky_ = e;
    ++failures_;
  }
  context_failed();
}

void sim_api::context_failed() {
  wake_event_waiters();
  // The device stops: copies and kernels already running finish before
  // anyone learns of the failure, later ones never start.
  std::unique_lock stop(running_);
}

std::uint64_t sim_api::epoch() const {
  std::lock_guard lock(mutex_);
  return failures_;
}

bool sim_api::failed_since(std::uint64_t epoch) const {
  std::lock_guard lock(mutex_);
  return sticky_ != error::success || failures_ != epoch;
}

void sim_api::wake_event_waiters() {
  std::vector<std::shared_ptr<event>> events;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [handle, ev] : events_) events.push_back(ev);
  }
  // Streams waiting for an event re-check the context under the event's
  // lock; taking it here means none of them misses this wake-up.
  for (const std::shared_ptr<event>& ev : events) {
    std::lock_guard lock(ev->mutex);
    ev->done.notify_all();
  }
}

void sim_api::clear_faults() {
  std::lock_guard lock(mutex_);
  sticky_ = error::success;
  call_faults_.clear();
  nth_faults_.clear();
}

error sim_api::sticky_error() const {
  std::lock_guard lock(mutex_);
  return sticky_;
}

std::map<std::string, std::uint64_t> sim_api::call_counts() const {
  std::lock_guard lock(mutex_);
  return call_counts_;
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

error sim_api::enter(const char* call) {
  const std::uint64_t n = ++calls_;
  bool became_sticky = false;
  const error result = [&] {
    std::lock_guard lock(mutex_);
    const std::uint64_t nth_of_call = ++call_counts_[call];
    if (sticky_ != error::success) return sticky_;
    for (auto it = nth_faults_.begin(); it != nth_faults_.end(); ++it) {
      if (it->call == n) {
        const error e = it->e;
        if (it->sticky) {
          sticky_ = e;
          ++failures_;
          became_sticky = true;
        }
        nth_faults_.erase(it);
        return e;
      }
    }
    auto faults = call_faults_.find(call);
    if (faults != call_faults_.end()) {
      for (auto it = faults->second.begin(); it != faults->second.end(); ++it) {
        if (it->call == nth_of_call) {
          const error e = it->e;
          if (it->sticky) {
            sticky_ = e;
            ++failures_;
            became_sticky = true;
          }
          faults->second.erase(it);
          return e;
        }
      }
    }
    return error::success;
  }();
  if (became_sticky) context_failed();
  return result;
}

std::shared_ptr<sim_api::stream> sim_api::find_stream(stream_t handle) {
  std::lock_guard lock(mutex_);
  if (is_legacy_default(handle)) {
    if (current_device < 0 || current_device >= options_.devices) return nullptr;
    return default_streams_[static_cast<std::size_t>(current_device)];
  }
  auto it = streams_.find(handle);
  return it == streams_.end() ? nullptr : it->second;
}

std::shared_ptr<sim_api::event> sim_api::find_event(event_t handle) {
  std::lock_guard lock(mutex_);
  auto it = events_.find(handle);
  return it == events_.end() ? nullptr : it->second;
}

pointer_attributes sim_api::locate(const void* pointer) const {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  auto it = memory_.upper_bound(address);
  if (it == memory_.begin()) return {};
  --it;
  if (address >= it->first + it->second.bytes) return {};
  return {it->second.type, it->second.device};
}

void sim_api::enqueue(const std::shared_ptr<stream>& s, std::function<void()> op) {
  // Work queued when the context fails never runs, even once faults are
  // cleared: a failed CUDA context does not come back.
  enqueue_always(s, [this, op = std::move(op), since = epoch()] {
    if (failed_since(since)) return;
    op();
  });
}

void sim_api::enqueue_always(const std::shared_ptr<stream>& s, std::function<void()> op) {
  {
    std::lock_guard lock(s->mutex);
    s->queue.push_back(std::move(op));
  }
  s->wake.notify_one();
}

void sim_api::run_copy(int device, int direction, std::size_t bytes, double gbps) {
  engine* e =
      direction < 2 ? engines_[static_cast<std::size_t>(device * 2 + direction)].get() : nullptr;
  if (direction < 2 && e == nullptr) e = engines_[static_cast<std::size_t>(device * 2)].get();
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

error sim_api::launch_host_func(stream_t handle, std::function<void()> fn) {
  if (error e = enter("cudaLaunchHostFunc"); e != error::success) return e;
  std::shared_ptr<stream> s = find_stream(handle);
  if (!s) return error::invalid_resource_handle;
  enqueue(s, std::move(fn));
  return error::success;
}

error sim_api::get_device_count(int* count) {
  if (error e = enter("cudaGetDeviceCount"); e != error::success) return e;
  *count = options_.devices;
  return error::success;
}

error sim_api::set_device(int device) {
  if (error e = enter("cudaSetDevice"); e != error::success) return e;
  if (device < 0 || device >= options_.devices) return error::invalid_device;
  current_device = device;
  return error::success;
}

error sim_api::get_device(int* device) {
  if (error e = enter("cudaGetDevice"); e != error::success) return e;
  *device = current_device;
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
  if (peer < 0 || peer >= options_.devices || peer == current_device) return error::invalid_device;
  std::lock_guard lock(mutex_);
  peer_enabled_[static_cast<std::size_t>(current_device)][static_cast<std::size_t>(peer)] = true;
  return error::success;
}

error sim_api::stream_create(stream_t* handle) {
  if (error e = enter("cudaStreamCreateWithFlags"); e != error::success) return e;
  auto s = std::make_shared<stream>();
  s->device = current_device;
  stream* raw = s.get();
  start_worker(*s);
  std::lock_guard lock(mutex_);
  streams_[raw] = std::move(s);
  *handle = raw;
  return error::success;
}

error sim_api::stream_destroy(stream_t handle) {
  if (error e = enter("cudaStreamDestroy"); e != error::success) return e;
  std::shared_ptr<stream> s;
  {
    std::lock_guard lock(mutex_);
    auto it = streams_.find(handle);
    if (it == streams_.end()) return error::invalid_resource_handle;
    s = std::move(it->second);
    streams_.erase(it);
  }
  // Like cudaStreamDestroy, queued work still runs; the thread ends after.
  s.reset();
  return error::success;
}

error sim_api::event_create(event_t* handle) {
  if (error e = enter("cudaEventCreateWithFlags"); e != error::success) return e;
  auto ev = std::make_shared<event>();
  ev->device = current_device;
  std::lock_guard lock(mutex_);
  *handle = ev.get();
  events_[ev.get()] = std::move(ev);
  return error::success;
}

error sim_api::event_destroy(event_t handle) {
  if (error e = enter("cudaEventDestroy"); e != error::success) return e;
  std::lock_guard lock(mutex_);
  return events_.erase(handle) == 1 ? error::success : error::invalid_resource_handle;
}

error sim_api::event_record(event_t handle, stream_t stream_handle) {
  if (error e = enter("cudaEventRecord"); e != error::success) return e;
  std::shared_ptr<event> ev = find_event(handle);
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!ev || !s) return error::invalid_resource_handle;
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(ev->mutex);
    generation = ++ev->recorded;
    ev->pending.insert(generation);
  }
  // Runs in a failed context too: queries report the context's error
  // anyway, and no event stays pending forever once faults are cleared.
  enqueue_always(s, [ev, generation] {
    {
      std::lock_guard lock(ev->mutex);
      ev->pending.erase(generation);
    }
    ev->done.notify_all();
  });
  return error::success;
}

error sim_api::event_query(event_t handle) {
  if (error e = enter("cudaEventQuery"); e != error::success) return e;
  std::shared_ptr<event> ev = find_event(handle);
  if (!ev) return error::invalid_resource_handle;
  std::lock_guard lock(ev->mutex);
  return ev->complete(ev->recorded) ? error::success : error::not_ready;
}

error sim_api::stream_wait_event(stream_t stream_handle, event_t handle) {
  if (error e = enter("cudaStreamWaitEvent"); e != error::success) return e;
  std::shared_ptr<event> ev = find_event(handle);
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!ev || !s) return error::invalid_resource_handle;
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(ev->mutex);
    generation = ev->recorded;
  }
  enqueue(s, [this, ev, generation] {
    std::unique_lock lock(ev->mutex);
    ev->done.wait(lock, [&] {
      if (ev->complete(generation)) return true;
      std::lock_guard sticky(mutex_);
      return sticky_ != error::success;  // a failed context never completes it
    });
  });
  return error::success;
}

error sim_api::malloc_async(void** pointer, std::size_t bytes, stream_t stream_handle) {
  if (error e = enter("cudaMallocAsync"); e != error::success) return e;
  if (!find_stream(stream_handle)) return error::invalid_resource_handle;
  return allocate(pointer, bytes, memory_type::device);
}

error sim_api::allocate(void** pointer, std::size_t bytes, memory_type type) {
  const int device = current_device;
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
  void* pointer = reinterpret_cast<void*>(it->first);
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
  memory_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, current_device, memory_type::host};
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

error sim_api::launch_gather(void* dst, const void* src, const strided_layout& layout,
                             stream_t stream_handle) {
  if (error e = enter("dlasyncGatherKernel"); e != error::success) return e;
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!s) return error::invalid_resource_handle;
  {
    std::lock_guard lock(mutex_);
    const pointer_attributes out = locate(dst);
    if (out.type != memory_type::device || out.device != s->device) return error::invalid_value;
  }
  auto copy = std::make_shared<strided_copy>(layout);
  enqueue(s, [this, copy, dst, src, device = s->device, since = epoch()] {
    std::shared_lock running(running_);
    if (failed_since(since)) return;
    run_copy(device, 2, copy->bytes(), options_.device_to_device_gbps);
    copy->run(src, dst, 0, copy->units());
  });
  return error::success;
}

}  // namespace dlasync::cuda
