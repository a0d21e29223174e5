#include "runtime/sim/sim_api.hpp"

#include <shared_mutex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/sim/sim_site.hpp"
#include "runtime/sim/sim_state.hpp"

namespace dlasync::cuda {
namespace {

// cudart's special stream handles: 0 (the NULL stream) and 1
// (cudaStreamLegacy) name the legacy default stream, 2
// (cudaStreamPerThread) the calling thread's default stream.
bool is_legacy_handle(stream_t s) {
  return s == nullptr || s == reinterpret_cast<stream_t>(1);
}
bool is_per_thread_handle(stream_t s) {
  return s == reinterpret_cast<stream_t>(2);
}

std::string thread_name() {
  std::ostringstream out;
  out << std::this_thread::get_id();
  return out.str();
}

// Waits under `mutex` until `complete()`, or until the context failed,
// which never completes it.
template <typename Failed>
void wait_for_record(std::mutex& mutex, std::condition_variable& done,
                     const std::function<bool()>& complete, Failed failed) {
  std::unique_lock lock(mutex);
  while (!complete()) {
    if (failed()) return;
    done.wait_for(lock, std::chrono::milliseconds(2));
  }
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

std::shared_ptr<sim_api::stream> sim_api::new_stream(int device, bool blocking, const char* kind) {
  auto s = std::make_shared<stream>();
  s->device = device;
  s->blocking = blocking;
  {
    std::lock_guard lock(mutex_);
    s->name = absl::StrCat(kind, " #", ++stream_count_, " of cuda:", device);
  }
  s->agent = checker_.add_stream(s->name);
  start_worker(*s);
  return s;
}

std::shared_ptr<sim_api::stream> sim_api::find_stream(stream_t handle) {
  const int device = sim_current_device;
  if (device < 0 || device >= options_.devices) return nullptr;
  if (is_legacy_handle(handle)) return legacy_streams_[static_cast<std::size_t>(device)];
  const auto key = std::make_pair(std::this_thread::get_id(), device);
  if (is_per_thread_handle(handle)) {
    {
      std::lock_guard lock(mutex_);
      if (auto it = thread_streams_.find(key); it != thread_streams_.end()) return it->second;
    }
    const std::string kind =
        absl::StrCat("the per-thread default stream of thread ", thread_name());
    std::shared_ptr<stream> s = new_stream(device, true, kind.c_str());
    std::lock_guard lock(mutex_);
    return thread_streams_.emplace(key, std::move(s)).first->second;
  }
  std::lock_guard lock(mutex_);
  auto it = streams_.find(handle);
  return it == streams_.end() ? nullptr : it->second;
}

std::shared_ptr<sim_api::event> sim_api::find_event(event_t handle) {
  std::lock_guard lock(mutex_);
  auto it = events_.find(handle);
  return it == events_.end() ? nullptr : it->second;
}

void sim_api::push(stream& s, std::function<void()> op) {
  {
    std::lock_guard lock(s.mutex);
    s.queue.push_back(std::move(op));
  }
  s.wake.notify_one();
}

void sim_api::chain(const std::shared_ptr<stream>& waiter,
                    const std::shared_ptr<stream>& signaller) {
  auto ev = std::make_shared<event>();
  ev->pending.insert(1);
  push(*signaller, [ev] {
    {
      std::lock_guard lock(ev->mutex);
      ev->pending.clear();
    }
    ev->done.notify_all();
  });
  push(*waiter, [this, ev] {
    wait_for_record(
        ev->mutex, ev->done, [&] { return ev->pending.empty(); },
        [this] { return sticky_error() != error::success; });
  });
  if (options_.check_order) checker_.wait_for_stream(waiter->agent, signaller->agent);
}

void sim_api::order_with_legacy(const std::shared_ptr<stream>& s) {
  if (s->legacy) {
    std::vector<std::shared_ptr<stream>> blocking;
    {
      std::lock_guard lock(mutex_);
      for (const auto& [handle, b] : streams_) {
        if (b->device == s->device && b->blocking && b->ops > b->seen_by_legacy) {
          blocking.push_back(b);
        }
      }
      for (const auto& [key, b] : thread_streams_) {
        if (b->device == s->device && b->ops > b->seen_by_legacy) blocking.push_back(b);
      }
    }
    for (const std::shared_ptr<stream>& b : blocking) {
      chain(s, b);
      b->seen_by_legacy = b->ops;
    }
  } else if (s->blocking) {
    const std::shared_ptr<stream>& legacy = legacy_streams_[static_cast<std::size_t>(s->device)];
    if (legacy->ops > s->legacy_seen) {
      chain(s, legacy);
      s->legacy_seen = legacy->ops;
    }
  }
  ++s->ops;
}

void sim_api::enqueue(const std::shared_ptr<stream>& s, std::function<void()> op,
                      std::span<const access> accesses, const op_label& label, bool always) {
  std::vector<std::string> found;
  {
    std::lock_guard order(order_mutex_);
    order_with_legacy(s);
    if (options_.check_order) {
      // Work queued in a failed context never runs: it touches nothing.
      // Under mutex_, which a failing context holds while the checker
      // learns that all queued work is void.
      std::lock_guard lock(mutex_);
      op_label tagged = label;
      tagged.owner = work_owner;
      const bool runs = sticky_ == error::success;
      found = checker_.enqueue(s->agent, runs ? accesses : std::span<const access>(), tagged);
    }
    if (op && always) {
      push(*s, std::move(op));
    } else if (op) {
      // Work queued when the context fails never runs, even once faults are
      // cleared: a failed CUDA context does not come back.
      push(*s, [this, op = std::move(op), since = epoch()] {
        if (failed_since(since)) return;
        op();
      });
    }
  }
  for (std::string& r : found) report(std::move(r));
}

void sim_api::drain_stream(const std::shared_ptr<stream>& s) {
  struct waiter {
    std::mutex mutex;
    std::condition_variable done;
    bool finished = false;
  };
  auto w = std::make_shared<waiter>();
  order_checker::clock reached;
  {
    std::lock_guard order(order_mutex_);
    if (options_.check_order) reached = checker_.capture(s->agent);
    push(*s, [w] {
      std::lock_guard lock(w->mutex);
      w->finished = true;
      w->done.notify_all();
    });
  }
  std::unique_lock lock(w->mutex);
  w->done.wait(lock, [&] { return w->finished; });
  if (options_.check_order) checker_.host_learns(reached);
}

void sim_api::synchronize_all() {
  std::vector<std::shared_ptr<stream>> all(legacy_streams_.begin(), legacy_streams_.end());
  {
    std::lock_guard lock(mutex_);
    for (const auto& [handle, s] : streams_) all.push_back(s);
    for (const auto& [key, s] : thread_streams_) all.push_back(s);
  }
  for (const std::shared_ptr<stream>& s : all) drain_stream(s);
}

error sim_api::launch_host_func(stream_t handle, std::function<void()> fn, site where) {
  if (error e = enter("cudaLaunchHostFunc"); e != error::success) return failed(e);
  std::shared_ptr<stream> s = find_stream(handle);
  if (!s) {
    return unknown_handle("cudaLaunchHostFunc", "stream", where);
  }
  enqueue(s, std::move(fn), {}, {"cudaLaunchHostFunc", site_name(where)});
  return error::success;
}

error sim_api::stream_get_device(stream_t handle, int* device) {
  if (error e = enter("cudaStreamGetDevice"); e != error::success) return failed(e);
  std::shared_ptr<stream> s = find_stream(handle);
  if (!s) {
    return unknown_handle("cudaStreamGetDevice", "stream", site::current());
  }
  *device = s->device;
  return error::success;
}

error sim_api::stream_create(stream_t* handle, stream_flags flags) {
  if (error e = enter("cudaStreamCreateWithFlags"); e != error::success) return failed(e);
  const int device = sim_current_device;
  open_context(device);
  const bool blocking = flags == stream_flags::blocking;
  std::shared_ptr<stream> s =
      new_stream(device, blocking, blocking ? "blocking stream" : "non-blocking stream");
  stream* raw = s.get();
  std::lock_guard lock(mutex_);
  streams_[raw] = std::move(s);
  *handle = raw;
  return error::success;
}

error sim_api::stream_destroy(stream_t handle) {
  if (error e = enter("cudaStreamDestroy"); e != error::success) return failed(e);
  std::shared_ptr<stream> s;
  {
    std::lock_guard lock(mutex_);
    auto it = streams_.find(handle);
    if (it != streams_.end()) {
      s = std::move(it->second);
      streams_.erase(it);
    }
  }
  if (!s) {
    return refuse(error::invalid_resource_handle, "cudaStreamDestroy",
                  "the stream handle names no live stream (destroyed already, never created, "
                  "or a special handle)",
                  site::current());
  }
  // Like cudaStreamDestroy, queued work still runs; the thread ends after.
  s.reset();
  return error::success;
}

error sim_api::event_create(event_t* handle) {
  if (error e = enter("cudaEventCreateWithFlags"); e != error::success) return failed(e);
  open_context(sim_current_device);
  auto ev = std::make_shared<event>();
  ev->device = sim_current_device;
  std::lock_guard lock(mutex_);
  *handle = ev.get();
  events_[ev.get()] = std::move(ev);
  return error::success;
}

error sim_api::event_destroy(event_t handle) {
  if (error e = enter("cudaEventDestroy"); e != error::success) return failed(e);
  bool erased = false;
  {
    std::lock_guard lock(mutex_);
    erased = events_.erase(handle) == 1;
  }
  if (!erased) {
    return refuse(error::invalid_resource_handle, "cudaEventDestroy",
                  "the event handle names no live event (destroyed already, or never created)",
                  site::current());
  }
  return error::success;
}

error sim_api::event_record(event_t handle, stream_t stream_handle, site where) {
  if (error e = enter("cudaEventRecord"); e != error::success) return failed(e);
  std::shared_ptr<event> ev = find_event(handle);
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!ev || !s) {
    return unknown_handle("cudaEventRecord", !ev ? "event" : "stream", where);
  }
  if (ev->device != s->device) {
    return refuse(error::invalid_resource_handle, "cudaEventRecord",
                  absl::StrCat("the event belongs to cuda:", ev->device, " and ", s->name,
                               " to another device; record an event of the stream's device"),
                  where);
  }
  std::lock_guard order(order_mutex_);
  order_with_legacy(s);
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(ev->mutex);
    generation = ++ev->recorded;
    ev->pending.insert(generation);
    if (options_.check_order) ev->clock = checker_.capture(s->agent);
  }
  // Runs in a failed context too: queries report the context's error
  // anyway, and no event stays pending forever once faults are cleared.
  push(*s, [ev, generation] {
    {
      std::lock_guard lock(ev->mutex);
      ev->pending.erase(generation);
    }
    ev->done.notify_all();
  });
  return error::success;
}

error sim_api::event_query(event_t handle) {
  if (error e = enter("cudaEventQuery"); e != error::success) return failed(e);
  std::shared_ptr<event> ev = find_event(handle);
  if (!ev) {
    return unknown_handle("cudaEventQuery", "event", site::current());
  }
  order_checker::clock learned;
  {
    std::lock_guard lock(ev->mutex);
    if (!ev->complete(ev->recorded)) return error::not_ready;
    learned = ev->clock;
  }
  if (options_.check_order) checker_.host_learns(learned);
  return error::success;
}

error sim_api::stream_wait_event(stream_t stream_handle, event_t handle, site where) {
  if (error e = enter("cudaStreamWaitEvent"); e != error::success) return failed(e);
  std::shared_ptr<event> ev = find_event(handle);
  std::shared_ptr<stream> s = find_stream(stream_handle);
  if (!ev || !s) {
    return unknown_handle("cudaStreamWaitEvent", !ev ? "event" : "stream", where);
  }
  std::lock_guard order(order_mutex_);
  order_with_legacy(s);
  std::uint64_t generation = 0;
  {
    std::lock_guard lock(ev->mutex);
    generation = ev->recorded;
    if (options_.check_order) checker_.wait(s->agent, ev->clock);
  }
  push(*s, [this, ev, generation, since = epoch()] {
    if (failed_since(since)) return;
    wait_for_record(
        ev->mutex, ev->done, [&] { return ev->complete(generation); },
        [this] { return sticky_error() != error::success; });
  });
  return error::success;
}

void sim_api::host_access(const void* pointer, std::uint64_t bytes, host_use use, const char* what,
                          std::uint64_t owner, site where) {
  if (!options_.check_order) return;
  located l;
  {
    std::lock_guard lock(mutex_);
    l = locate(pointer);
  }
  // Device work touches only CUDA memory: nothing to check elsewhere.
  if (!l.known) return;
  for (std::string& r : checker_.host_access(l.base, reinterpret_cast<std::uintptr_t>(pointer),
                                             bytes, use, {what, site_name(where), owner})) {
    report(std::move(r));
  }
}

}  // namespace dlasync::cuda
