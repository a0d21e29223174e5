// What the copy engine uses of the runtime (internal), and nothing more:
// every copy path takes these instead of the runtime's core, so that each
// can be built and tested from its parts (a work pool, a host backend, a
// CUDA context), and so that the import orchestrator is the one part of
// transfer that reaches the core (transfer/src/import/copy_services_of).
#pragma once

#include <cstdint>
#include <functional>

#include "runtime/src/cuda/cuda_api.hpp"
#include "runtime/src/cuda/cuda_context.hpp"
#include "runtime/src/host/host_backend.hpp"
#include "runtime/src/work_pool.hpp"

namespace dlasync::detail {

// Non-owning: the runtime that lends them outlives every copy it starts.
// A few words, copied into the tasks that outlive a call.
struct copy_services {
  // Help large host copies; the staging pipeline offers them its gathers.
  work_pool* workers = nullptr;
  // The in-order host streams a host-to-host copy runs on.
  host_backend* host = nullptr;
  // The streams, events and staging chunks of the GPU paths; null without
  // a CUDA backend (the plan then chooses no GPU path).
  cuda_context* cuda = nullptr;
  // The CUDA runtime behind it (real or simulated), for the host copy's
  // declared reads of page-locked memory; null without one.
  cuda::api* cuda_api = nullptr;
  // A host copy of at least this many bytes is split among the workers
  // (runtime_options::parallel_copy_bytes), up to `worker_threads` ways.
  std::uint64_t parallel_copy_bytes = 1 << 20;
  int worker_threads = 1;
  // Called after each piece of a host copy (the tests' seam); null or empty
  // otherwise.
  const std::function<void()>* unit_observer = nullptr;

  void observe_unit() const {
    if (unit_observer != nullptr && *unit_observer) (*unit_observer)();
  }
};

}  // namespace dlasync::detail
