// The strided float32 layouts the benchmarks copy to row-major order, host
// tensors of them, and the copy-import loop the programs share.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/io_context.hpp"
#include "dlasync/dlasync.hpp"
#include "paired.hpp"

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

// A buffer aligned to a cache line, as the frameworks' allocators and the
// runtime's own align theirs (an unaligned one splits every line a kernel
// writes in two).
template <typename T>
struct aligned_buffer {
  struct free_deleter {
    void operator()(T* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<T[], free_deleter> data;
  std::size_t size = 0;

  // Grows to `count` elements of `value`, dropping the old contents.
  void grow(std::size_t count, T value) {
    if (size >= count) return;
    data.reset();
    const std::size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
    data.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!data) std::abort();
    std::fill(data.get(), data.get() + count, value);
    size = count;
  }
};

// `count` floats of ones, shared by every benchmark of the program and grown
// to the largest count asked for (benchmarks run from small to large):
// filling gigabytes of fresh memory for every repetition would take longer
// than the benchmarks, and would measure page faults.
inline const float* ones(std::size_t count) {
  static aligned_buffer<float> buffer;
  buffer.grow(count, 1.0f);
  return buffer.data.get();
}

// The shared ones grown for layout `l` and for a baseline that reads its
// copy's bytes from the start (a broadcast or reversed layout spans less):
// call it before taking pointers into the buffer for `l`, since growing it
// later moves it.
inline const float* ones_for(const layout& l) {
  return ones(static_cast<std::size_t>(std::max(l.buffer, copy_bytes(l) / 4)));
}

// `bytes` of scratch memory, shared and grown the same way (destinations
// of the baselines and kernels: warm, as the runtime's cached blocks are).
inline char* scratch(std::size_t bytes) {
  static aligned_buffer<char> buffer;
  buffer.grow(bytes, 0);
  return buffer.data.get();
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

// Whole copy imports of `kind` at state.range(0) bytes, into a compact
// tensor, awaited by a coroutine on an io_context of this thread (as a
// server handler would), after one untimed import; paired, interleaved, with
// `base(src, dst, bytes)`, a baseline run in the same coroutine on the same
// source (`src`: the buffer's first element; layout `l`) and a warm
// destination of the same bytes (see paired.hpp).
template <typename Base>
void import_copies_paired(benchmark::State& state, dlasync::runtime& rt, const std::string& kind,
                          Base&& base) {
  const layout l = make_layout(kind, state.range(0));
  const std::int64_t bytes = copy_bytes(l);
  // The baseline reads `bytes` from the start of the buffer of ones, which
  // grows here first, so that host_source's own call below does not move it.
  const float* base_src = ones_for(l);
  host_source src(l);
  char* dst = scratch(static_cast<std::size_t>(bytes));
  const std::int64_t batch = batch_for(bytes);
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
          if (!warm.ok()) {
            state.SkipWithError(std::string(warm.status().message()).c_str());
            co_return;
          }
        }
        pair_clock clock(state, batch);
        for (auto _ : state) {
          for (int half = 0; half < 2; ++half) {
            const bool b = clock.baseline_turn(half);
            clock.start();
            for (std::int64_t i = 0; i < batch; ++i) {
              if (b) {
                base(base_src, dst, bytes);
              } else {
                dlasync::managed_tensor source(&src.managed);
                absl::StatusOr<dlasync::tensor> t = co_await dlasync::import_dlpack(rt, source, o);
                benchmark::DoNotOptimize(t);
              }
            }
            benchmark::ClobberMemory();
            clock.stop(b);
          }
        }
        clock.finish(static_cast<double>(bytes));
      },
      asio::detached);
  io.run();
}

}  // namespace dlasync::bench
