#include "runtime/sim/sim_api.hpp"

#include <shared_mutex>

#include "runtime/sim/sim_state.hpp"

namespace dlasync::cuda {
namespace {

// DLPack's and cudart's special stream handles.
bool is_legacy_default(stream_t s) {
  return s == nullptr || s == reinterpret_cast<stream_t>(1) || s == reinterpret_cast<stream_t>(2);
}

}  // namespace

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

std::shared_ptr<sim_api::stream> sim_api::find_stream(stream_t handle) {
  std::lock_guard lock(mutex_);
  if (is_legacy_default(handle)) {
    if (sim_current_device < 0 || sim_current_device >= options_.devices) return nullptr;
    return default_streams_[static_cast<std::size_t>(sim_current_device)];
  }
  auto it = streams_.find(handle);
  return it == streams_.end() ? nullptr : it->second;
}

std::shared_ptr<sim_api::event> sim_api::find_event(event_t handle) {
  std::lock_guard lock(mutex_);
  auto it = events_.find(handle);
  return it == events_.end() ? nullptr : it->second;
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

error sim_api::launch_host_func(stream_t handle, std::function<void()> fn) {
  if (error e = enter("cudaLaunchHostFunc"); e != error::success) return e;
  std::shared_ptr<stream> s = find_stream(handle);
  if (!s) return error::invalid_resource_handle;
  enqueue(s, std::move(fn));
  return error::success;
}

error sim_api::stream_create(stream_t* handle) {
  if (error e = enter("cudaStreamCreateWithFlags"); e != error::success) return e;
  auto s = std::make_shared<stream>();
  s->device = sim_current_device;
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
  ev->device = sim_current_device;
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

error sim_api::launch_kernel(std::shared_ptr<const device_kernel> kernel, stream_t stream_handle) {
  if (error e = enter(kernel->name()); e != error::success) return e;
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!s) return error::invalid_resource_handle;
  {
    std::lock_guard lock(mutex_);
    const pointer_attributes out = locate(kernel->output());
    if (out.type != memory_type::device || out.device != s->device) return error::invalid_value;
  }
  enqueue(s, [this, kernel = std::move(kernel), device = s->device, since = epoch()] {
    std::shared_lock running(running_);
    if (failed_since(since)) return;
    run_copy(device, 2, kernel->output_bytes(), options_.device_to_device_gbps);
    kernel->simulate();
  });
  return error::success;
}

}  // namespace dlasync::cuda
