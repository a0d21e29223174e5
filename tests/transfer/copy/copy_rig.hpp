// The copy engine's parts without a runtime: a work pool, a host backend
// on it, and (when asked) a CUDA context on two simulated GPUs (rules and
// race checks on) whose completions run on the pool, as a runtime's do.
// `services()` lends them as the copy engine takes them
// (transfer/src/copy/copy_services.hpp). Torn down in the runtime's order.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <memory>

#include "absl/status/status.h"
#include "catch2/catch.hpp"
#include "runtime/sim/sim_api.hpp"
#include "runtime/src/completion_marker.hpp"
#include "runtime/src/cuda/cuda_context.hpp"
#include "runtime/src/cuda/device_guard.hpp"
#include "runtime/src/handoff.hpp"
#include "runtime/src/host/host_backend.hpp"
#include "runtime/src/work_pool.hpp"
#include "transfer/src/copy/copy_services.hpp"

namespace dlasync::testing {

struct copy_rig_options {
  int workers = 2;
  bool cuda = true;  // two simulated GPUs
  std::uint64_t chunk_bytes = 4096;
  int chunks = 2;
  // Split a host copy of this many bytes among the workers.
  std::uint64_t parallel_copy_bytes = 1 << 20;
};

struct copy_rig {
  std::shared_ptr<cuda::sim_api> sim;
  detail::work_pool pool;
  detail::host_backend host;
  std::shared_ptr<detail::handoff> completions = std::make_shared<detail::handoff>();
  std::shared_ptr<std::atomic<int>> chunks_in_use = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<detail::cuda_context> context;
  // Called after each piece of a host copy, when set.
  std::function<void()> unit_observer;
  copy_rig_options options;

  explicit copy_rig(copy_rig_options o = {})
      : pool(o.workers, std::chrono::nanoseconds(0)), host({}, pool), options(o) {
    completions->attach(pool);
    if (!o.cuda) return;
    cuda::sim_options so;
    so.check_order = true;
    so.on_report = cuda::report_action::collect;
    sim = std::make_shared<cuda::sim_api>(so);
    // Peer and pool access between the two GPUs, as the CUDA backend sets
    // them up (copies across GPUs read the other's stream-ordered memory).
    for (int d = 0; d < 2; ++d) {
      absl::StatusOr<detail::device_guard> on = detail::device_guard::enter(*sim, d);
      REQUIRE(on.ok());
      REQUIRE(sim->device_enable_peer_access(1 - d) == cuda::error::success);
      REQUIRE(sim->mem_pool_set_access(d, 1 - d) == cuda::error::success);
    }
    detail::cuda_options co;
    co.staging_chunk_bytes = o.chunk_bytes;
    co.staging_chunks = o.chunks;
    co.completions = completions;
    co.chunks_in_use = chunks_in_use;
    absl::StatusOr<std::shared_ptr<detail::cuda_context>> c =
        detail::cuda_context::create(sim, co, {true, true});
    REQUIRE(c.ok());
    context = *std::move(c);
  }
  copy_rig(const copy_rig&) = delete;
  copy_rig& operator=(const copy_rig&) = delete;
  ~copy_rig() {
    if (context) context->quiesce();
    completions->detach();
    pool.drain();
    context.reset();
  }

  detail::copy_services services() {
    detail::copy_services with;
    with.workers = &pool;
    with.host = &host;
    with.cuda = context.get();
    with.cuda_api = sim.get();
    with.parallel_copy_bytes = options.parallel_copy_bytes;
    with.worker_threads = options.workers;
    with.unit_observer = &unit_observer;
    return with;
  }

  cuda::stream_t stream() const { return context->stream(0, 0); }

  // Device memory of GPU `d` holding `bytes` from `init` (zeros when null).
  void* device_memory(std::size_t bytes, int d = 0, const void* init = nullptr) {
    absl::StatusOr<detail::device_guard> on = detail::device_guard::enter(*sim, d);
    REQUIRE(on.ok());
    void* p = nullptr;
    REQUIRE(sim->malloc_device(&p, bytes) == cuda::error::success);
    if (init != nullptr) {
      std::memcpy(p, init, bytes);
    } else {
      std::memset(p, 0, bytes);
    }
    return p;
  }
  void free_device_memory(void* p) { REQUIRE(sim->free_device(p) == cuda::error::success); }
};

// Waits (30 s at most: a hang guard) for `m` and returns its status.
inline absl::Status finished(const marker_ptr& m) {
  auto got = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> f = got->get_future();
  m->on_complete([got](absl::Status s) { got->set_value(std::move(s)); });
  REQUIRE(f.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  return f.get();
}

}  // namespace dlasync::testing
