// The strided float32 layouts the benchmarks copy to row-major order, host
// tensors of them, and the copy-import loop the programs share.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/io_context.hpp"
#include "dlasync/dlasync.hpp"

namespace dlasync::bench {

// Strided layouts whose compact copy is `bytes` long, of float32.
struct layout {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::int64_t first = 0;   // elements from the buffer start to the first element
  std::int64_t buffer = 0;  // elements of backing buffer
};

inline layout make_layout(const std::string& kind, std::int64_t bytes) {
  const std::int64_t n = bytes / 4;
  if (kind == "rows") {  // every other row of runs of 256 floats: 1 KiB runs
    const std::int64_t cols = 256;
    const std::int64_t rows = std::max<std::int64_t>(1, n / cols);
    return {{rows, cols}, {2 * cols, 1}, 0, 2 * rows * cols};
  }
  if (kind == "transpose2d") {
    std::int64_t side = 1;
    while ((side * 2) * (side * 2) <= n) side *= 2;
    return {{side, side}, {1, side}, 0, side * side};
  }
  if (kind == "transpose3d") {  // (a, b, c) read as (a, c, b)
    std::int64_t side = 1;
    while ((side * 2) * (side * 2) * 8 <= n) side *= 2;
    return {{8, side, side}, {side * side, 1, side}, 0, 8 * side * side};
  }
  if (kind == "broadcast") {  // one row of 256 repeated
    return {{std::max<std::int64_t>(1, n / 256), 256}, {0, 1}, 0, 256};
  }
  // reversed rows
  const std::int64_t rows = std::max<std::int64_t>(1, n / 256);
  return {{rows, 256}, {-256, 1}, (rows - 1) * 256, rows * 256};
}

inline std::int64_t copy_bytes(const layout& l) {
  std::int64_t count = 4;
  for (std::int64_t e : l.shape) count *= e;
  return count;
}

// `count` floats of ones, shared by every benchmark of the program and grown
// to the largest count asked for (benchmarks run from small to large):
// filling gigabytes of fresh memory for every repetition would take longer
// than the benchmarks, and would measure page faults.
inline const float* ones(std::size_t count) {
  static std::vector<float> buffer;
  if (buffer.size() < count) {
    buffer = std::vector<float>();
    buffer.assign(count, 1.0f);
  }
  return buffer.data();
}

// `bytes` of scratch memory, shared and grown the same way (destinations
// of the baselines and kernels: warm, as the runtime's cached blocks are).
inline char* scratch(std::size_t bytes) {
  static std::vector<char> buffer;
  if (buffer.size() < bytes) {
    buffer = std::vector<char>();
    buffer.resize(bytes, 0);
  }
  return buffer.data();
}

// A host float32 tensor of layout `l` over ones (shared), without a
// deleter: wrapping it in a managed_tensor costs nothing.
struct host_source {
  std::vector<float> own;  // small tensors' own data
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  DLManagedTensorVersioned managed{};

  explicit host_source(const layout& l) : shape(l.shape), strides(l.strides) {
    init(ones(static_cast<std::size_t>(l.buffer)), l.first);
    managed.dl_tensor.strides = strides.data();
  }
  // A compact rows x cols tensor with NULL strides (the common fast case).
  host_source(std::int64_t rows, std::int64_t cols)
      : own(static_cast<std::size_t>(rows * cols), 1.0f), shape{rows, cols} {
    init(own.data(), 0);
  }
  host_source(const host_source&) = delete;
  host_source& operator=(const host_source&) = delete;

 private:
  void init(const float* data, std::int64_t first) {
    managed.version = {1, 3};
    managed.dl_tensor.data = const_cast<float*>(data);
    managed.dl_tensor.byte_offset = static_cast<std::uint64_t>(first) * 4;
    managed.dl_tensor.device = dlasync::to_dl_device(dlasync::host_device);
    managed.dl_tensor.ndim = static_cast<std::int32_t>(shape.size());
    managed.dl_tensor.dtype = dlasync::dtypes::float32.to_dl();
    managed.dl_tensor.shape = shape.data();
  }
};

// One whole copy import of `kind` at state.range(0) bytes per iteration,
// into a compact tensor, awaited by a coroutine on an io_context of this
// thread (as a server handler would), after one untimed import; bytes
// copied counted.
inline void import_copies(benchmark::State& state, dlasync::runtime& rt, const std::string& kind) {
  const layout l = make_layout(kind, state.range(0));
  host_source src(l);
  dlasync::import_options o;
  o.require_contiguous = true;
  o.copy = true;
  asio::io_context io;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        {  // One untimed import: the runtime's block cache holds the size.
          dlasync::managed_tensor source(&src.managed);
          absl::StatusOr<dlasync::tensor> warm = co_await dlasync::import_dlpack(rt, source, o);
          if (!warm.ok()) state.SkipWithError(std::string(warm.status().message()).c_str());
        }
        for (auto _ : state) {
          dlasync::managed_tensor source(&src.managed);
          absl::StatusOr<dlasync::tensor> t = co_await dlasync::import_dlpack(rt, source, o);
          if (!t.ok()) state.SkipWithError(std::string(t.status().message()).c_str());
          benchmark::DoNotOptimize(t);
        }
      },
      asio::detached);
  io.run();
  state.SetBytesProcessed(state.iterations() * copy_bytes(l));
}

}  // namespace dlasync::bench
