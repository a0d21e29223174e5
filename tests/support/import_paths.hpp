// Test support: the import paths of the CUDA backend as data, with source
// memory on two simulated GPUs that a deleter can free at once, for tests
// that run every path (fault injection, cancellation and shutdown storms).
#pragma once

#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "runtime/sim/sim_api.hpp"
#include "support/cuda_scenarios.hpp"

namespace dlasync::testing {

// One import path: what it imports, with which options, and what the
// result must hold.
struct path_case {
  const char* name;
  device source;
  std::optional<device> target;
  std::vector<std::int64_t> shape;
  std::optional<std::vector<std::int64_t>> strides;
  bool producer_stream = false;
  bool consumer_stream = false;
  std::optional<bool> copy;
};

// The paths through the CUDA backend, on cuda:0 and cuda:1.
inline const std::vector<path_case>& paths() {
  const device cpu{device_kind::cpu, 0};
  const device pinned{device_kind::cuda_host, 0};
  const device gpu0{device_kind::cuda, 0};
  const device gpu1{device_kind::cuda, 1};
  const device managed0{device_kind::cuda_managed, 0};
  const std::nullopt_t none = std::nullopt;
  const std::vector<std::int64_t> square{64, 64};
  const std::vector<std::int64_t> flat{4096};
  const std::vector<std::int64_t> transposed{1, 64};
  // name, source, target, shape, strides, producer stream, consumer stream, copy
  static const std::vector<path_case> all = {
      {"pageable host to GPU (staging pipeline)", cpu, gpu0, square, none, false, false, none},
      {"strided host to GPU (gathered while staged)",
       cpu,
       gpu1,
       {64, 32},
       transposed,
       false,
       false,
       none},
      {"pinned host to GPU (direct)", pinned, gpu0, flat, none, false, false, none},
      {"GPU to host (reverse pipeline)", gpu0, cpu, square, none, false, false, none},
      {"strided GPU to host (compacted first)",
       gpu1,
       cpu,
       {32, 64},
       std::vector<std::int64_t>{1, 32},
       false,
       false,
       none},
      {"GPU copy on the same GPU", gpu0, none, flat, none, false, false, true},
      {"GPU gather on the same GPU", gpu0, none, {64, 32}, transposed, false, false, true},
      {"peer copy between GPUs", gpu0, gpu1, flat, none, false, false, none},
      {"managed memory to host", managed0, cpu, flat, none, false, false, none},
      {"GPU view after the producer's stream", gpu1, none, flat, none, true, false, none},
      {"peer copy after the producer's stream, early resume on a consumer stream", gpu1, gpu0, flat,
       none, true, true, none},
  };
  return all;
}

// Source memory whose free failed in a failed context, as in CUDA: freed
// again once the faults are cleared.
struct unfreed_memory {
  std::mutex mutex;
  std::vector<std::pair<device_kind, void*>> blocks;

  void free_all(cuda::sim_api& sim) {
    std::lock_guard lock(mutex);
    for (const auto& [kind, p] : blocks) {
      CHECK((kind == device_kind::cuda_host ? sim.free_host(p) : sim.free_device(p)) ==
            cuda::error::success);
    }
    blocks.clear();
  }
};

// The source memory of a path and its element values, 0, 1, 2, ...; freed
// at once on destruction (cudaFree, not stream-ordered), so that a copy
// that still reads it afterwards shows under ASan.
// Waits on the host until `s` (of the current device) has run its work.
inline void synchronize(cuda::sim_api& sim, cuda::stream_t s) {
  cuda::event_t e = nullptr;
  REQUIRE(sim.event_create(&e) == cuda::error::success);
  REQUIRE(sim.event_record(e, s) == cuda::error::success);
  cuda::error done = sim.event_query(e);
  for (; done == cuda::error::not_ready; done = sim.event_query(e)) std::this_thread::yield();
  REQUIRE(done == cuda::error::success);
  REQUIRE(sim.event_destroy(e) == cuda::error::success);
}

struct source_memory {
  cuda::sim_api& sim;
  std::shared_ptr<unfreed_memory> unfreed;
  device where;
  std::vector<float> host;
  void* data = nullptr;
  std::size_t elements = 0;

  // With `synchronize_now` false, the caller synchronizes the legacy
  // streams itself before any import uses the memory (many at once).
  source_memory(cuda::sim_api& s, std::shared_ptr<unfreed_memory> u, const path_case& p,
                bool synchronize_now = true)
      : sim(s), unfreed(std::move(u)), where(p.source) {
    elements = 1;
    for (std::int64_t e : p.shape) elements *= static_cast<std::size_t>(e);
    std::vector<float> values(elements);
    std::iota(values.begin(), values.end(), 0.0f);
    const std::size_t bytes = elements * sizeof(float);
    switch (where.kind) {
      case device_kind::cpu:
        host = values;
        data = host.data();
        break;
      case device_kind::cuda_host:
        REQUIRE(sim.malloc_host(&data, bytes) == cuda::error::success);
        std::memcpy(data, values.data(), bytes);
        break;
      case device_kind::cuda_managed:
        sim.set_device(where.ordinal);
        REQUIRE(sim.malloc_managed(&data, bytes) == cuda::error::success);
        std::memcpy(data, values.data(), bytes);
        break;
      default:
        sim.set_device(where.ordinal);
        REQUIRE(sim.malloc_async(&data, bytes, legacy_stream()) == cuda::error::success);
        // Stream-ordered memory is usable on other streams once they are
        // ordered after the allocation: here, once the host has seen it.
        if (synchronize_now) synchronize(sim, legacy_stream());
        std::memcpy(data, values.data(), bytes);  // simulated device memory is host memory
        break;
    }
  }
  ~source_memory() {
    cuda::error e = cuda::error::success;
    if (where.kind == device_kind::cuda_host) e = sim.free_host(data);
    if (where.kind == device_kind::cuda_managed || where.kind == device_kind::cuda) {
      e = sim.free_device(data);
    }
    if (e != cuda::error::success) {
      std::lock_guard lock(unfreed->mutex);
      unfreed->blocks.emplace_back(where.kind, data);
    }
  }
  source_memory(const source_memory&) = delete;
  source_memory& operator=(const source_memory&) = delete;
};

// Empty when `t` holds the source's elements in row-major order, else what
// is wrong. Safe to call from any thread (no Catch assertions).
inline std::string mismatch(const tensor& t, const path_case& p) {
  if (!t.is_compact()) return "the result is not compact";
  const auto* v = static_cast<const float*>(t.data());
  const std::int64_t rows = p.shape.size() == 2 ? p.shape[0] : 1;
  const std::int64_t cols = p.shape.back();
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t at = p.strides ? r * (*p.strides)[0] + c * (*p.strides)[1] : r * cols + c;
      if (v[r * cols + c] != static_cast<float>(at)) {
        std::ostringstream out;
        out << p.name << ": element (" << r << ", " << c << ") is " << v[r * cols + c]
            << ", expected " << at;
        return out.str();
      }
    }
  }
  return {};
}

}  // namespace dlasync::testing
