// The simulation's shared state (internal to runtime/sim/): the stream,
// event and copy-engine records behind sim_api's handles, and what cudart
// keeps per thread (the current device, the last error).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "runtime/sim/sim_api.hpp"

namespace dlasync::cuda {

// The device made current by the calling thread (cudaSetDevice) and the
// thread's last error: per thread, as in cudart, and shared by every
// simulated runtime.
inline thread_local int sim_current_device = 0;
inline thread_local error sim_last_error = error::success;
// The device whose context is current on the thread (cudaSetDevice makes
// one current); -1 for none, as on a thread that has made no CUDA call.
inline thread_local int sim_current_context = -1;

// The allocation at `address`, a key of the memory map: the map is ordered
// by address, so that a pointer into an allocation finds it.
inline void* as_pointer(std::uintptr_t address) noexcept {
  // NOLINTNEXTLINE(performance-no-int-to-ptr): an allocation's own address
  return reinterpret_cast<void*>(address);
}

// An in-order queue with its own thread.
struct sim_api::stream {
  int device = 0;
  // Blocking streams (created without cudaStreamNonBlocking, and the
  // per-thread default streams) synchronize with the legacy stream.
  bool blocking = false;
  bool legacy = false;
  std::uint32_t agent = 0;  // the race checker's clock slot
  std::string name;
  // Operations queued so far, and how far the legacy stream (for a blocking
  // stream) or this stream (for the legacy stream's view of it) was seen:
  // the implicit synchronization chains streams only when new work came.
  std::uint64_t ops = 0;
  std::uint64_t legacy_seen = 0;
  std::uint64_t seen_by_legacy = 0;

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
  // What the latest record covers, for the race checker.
  order_checker::clock clock;

  bool complete(std::uint64_t generation) const { return !pending.contains(generation); }
};

// A copy engine: a timeline of the link. Each copy reserves the next free
// slot of bytes / bandwidth, in arrival order, then sleeps until its slot
// ends. Slots follow each other on the timeline, not on the moments the
// sleeps really end, so that the oversleeping of one copy does not slow the
// link down.

struct sim_api::engine {
  std::mutex mutex;
  std::chrono::steady_clock::time_point free_at{};
};

}  // namespace dlasync::cuda
