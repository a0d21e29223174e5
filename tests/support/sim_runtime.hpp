// Test support: runtimes on simulated GPUs, built one way for every test
// that needs them (the CUDA import, fault, storm and fuzz tests). Free of
// Catch, so that the fuzzers use it too.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "dlasync/runtime.hpp"
#include "runtime/sim/sim_api.hpp"
#include "runtime/src/runtime_core.hpp"

namespace dlasync::testing {

struct sim_runtime {
  std::shared_ptr<cuda::sim_api> sim;
  std::unique_ptr<runtime> rt;
};

// A runtime of one process with one host device and two workers, whose
// GPUs are simulated as `so` says; `tune`, when given, adjusts the options
// (staging chunks, budget, host devices, ...) before the runtime is made.
inline absl::StatusOr<sim_runtime> build_sim_runtime(
    cuda::sim_options so = {}, const std::function<void(runtime_options&)>& tune = {}) {
  sim_runtime r;
  r.sim = std::make_shared<cuda::sim_api>(so);
  runtime_options o;
  o.topology = process_topology::single_process();
  o.worker_threads = 2;
  if (tune) tune(o);
  detail::runtime_hooks hooks;
  hooks.cuda_api = r.sim;
  absl::StatusOr<std::unique_ptr<runtime>> rt = detail::create_runtime(std::move(o), hooks);
  if (!rt.ok()) return rt.status();
  r.rt = *std::move(rt);
  return r;
}

// The CUDA runtime (real or simulated) behind `rt`, or nullptr.
inline cuda::api* cuda_of(runtime& rt) {
  return detail::core_of(rt).cuda_api();
}

}  // namespace dlasync::testing
