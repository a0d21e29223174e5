// Test support: scenarios for the CUDA rules dlasync once broke, written
// against the CUDA seam so that they run on simulated GPUs (where the
// simulation enforces the rule) and on a real one (scripts/gpu-check.sh).
#pragma once

#include <chrono>
#include <cstring>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

#include "support/cuda_scenarios.hpp"

namespace dlasync::testing {

inline cuda::stream_t per_thread_stream() {
  return reinterpret_cast<cuda::stream_t>(2);
}

// Imports the strided `type` tensor `c` at `data` + `byte_offset` on GPU
// `device_ordinal` as a compact copy there (the gather), and checks its
// bytes against the host's copy of the memory, `host`, and its deleter.
inline void compact_on_gpu(runtime& rt, int device_ordinal, void* data, const void* host,
                           std::uint64_t byte_offset, dtype type, const layout_case& c) {
  tensor_spec s;
  s.device = {device_kind::cuda, device_ordinal};
  s.type = type;
  s.shape = c.shape;
  s.strides = c.strides;
  s.data = data;
  s.byte_offset = byte_offset;
  deleter_count count;
  managed_tensor source = make_tensor(s, count);
  import_options o;
  o.require_contiguous = true;
  absl::StatusOr<tensor> t = import_now(rt, source, o);
  INFO("status: " << t.status().ToString());
  REQUIRE(t.ok());
  CHECK(t->is_copy());
  CHECK(read_back(*cuda_of(rt), *t) ==
        expected_bytes(static_cast<const char*>(host) + byte_offset, c, type));
  t = absl::UnknownError("dropped");
  CHECK(eventually([&] { return count.calls == 1; }));
}

// A strided source whose address is not a multiple of its element size:
// complex64 at 4 mod 8 and complex128 at 8 mod 16, transposed, compacted on
// their GPU. The gather must move words the addresses allow; 8- or 16-byte
// loads there fault (cudaErrorMisalignedAddress), and lose the context.
inline void scenario_misaligned_gather(runtime& rt, int device_ordinal) {
  cuda::api& api = *cuda_of(rt);
  for (const dtype type : {dtypes::complex64, dtypes::complex128}) {
    const std::size_t element = type.bits / 8u;
    const std::size_t misalign = element / 2;
    INFO(type.name() << " at " << misalign << " mod " << element);
    constexpr std::int64_t rows = 24;
    constexpr std::int64_t cols = 40;
    std::vector<std::uint8_t> host(static_cast<std::size_t>(rows * cols) * element + 64);
    std::iota(host.begin(), host.end(), std::uint8_t{3});
    device_memory mem(api, device_ordinal, host.data(), host.size());
    compact_on_gpu(rt, device_ordinal, mem.data, host.data(), misalign, type,
                   {"transposed", {cols, rows}, std::vector<std::int64_t>{1, cols}});
  }
}

// A failed call leaves its error as the thread's last error; the gather
// launched after it on the same thread must report its own launch, not
// that error (a kernel launched with <<<>>> and checked with
// cudaGetLastError reports the earlier error instead).
inline void scenario_launch_after_failed_call(runtime& rt, int device_ordinal) {
  cuda::api& api = *cuda_of(rt);
  std::vector<float> host(64 * 32);
  std::iota(host.begin(), host.end(), 0.0f);
  device_memory mem(api, device_ordinal, host.data(), host.size() * sizeof(float));
  int count_devices = 0;
  REQUIRE(api.get_device_count(&count_devices) == cuda::error::success);
  REQUIRE(api.set_device(count_devices + 7) != cuda::error::success);  // sets the last error
  REQUIRE(api.peek_at_last_error() != cuda::error::success);
  REQUIRE(api.set_device(device_ordinal) == cuda::error::success);
  // Budget is free: the copy, and the gather's launch, start on this thread.
  compact_on_gpu(rt, device_ordinal, mem.data, host.data(), 0, dtypes::float32,
                 {"transposed", {32, 64}, std::vector<std::int64_t>{1, 32}});
  (void)api.get_last_error();
}

// A producer that writes on its thread's default stream (DLPack stream 2)
// imports with stream = 2. The import waits for the copy budget, which the
// release of another tensor grants on another thread: the producer's
// stream must still be this thread's. `delay` keeps the write pending.
inline void scenario_per_thread_producer(runtime& rt, int device_ordinal,
                                         std::chrono::milliseconds delay) {
  cuda::api& api = *cuda_of(rt);
  std::vector<float> stale(1024, -1.0f);
  std::vector<float> fresh(1024);
  std::iota(fresh.begin(), fresh.end(), 0.0f);
  device_memory mem(api, device_ordinal, stale.data(), stale.size() * sizeof(float));
  // A first copy holds the whole budget (the runtime's budget is one
  // tensor) until its tensor is dropped.
  std::vector<float> other(1024, 5.0f);
  tensor_spec h;
  h.shape = {1024};
  h.data = other.data();
  deleter_count held_count;
  managed_tensor held_source = make_tensor(h, held_count);
  import_options copy;
  copy.copy = true;
  absl::StatusOr<tensor> held = import_now(rt, held_source, copy);
  REQUIRE(held.ok());

  REQUIRE(api.set_device(device_ordinal) == cuda::error::success);
  slow_device_write write(api, per_thread_stream(), mem.data, fresh, delay);
  tensor_spec s;
  s.device = {device_kind::cuda, device_ordinal};
  s.shape = {1024};
  s.data = mem.data;
  deleter_count count;
  managed_tensor source = make_tensor(s, count);
  import_options o;
  o.stream = stream_per_thread_default;
  o.target = host_device;
  std::future<absl::StatusOr<tensor>> waiting =
      async_import_dlpack(rt, source, o, asio::use_future);
  // The budget comes back on another thread, which then starts the copy.
  std::thread([&] { held = absl::UnknownError("dropped"); }).join();
  absl::StatusOr<tensor> t = waiting.get();
  INFO("status: " << t.status().ToString());
  REQUIRE(t.ok());
  CHECK(static_cast<const float*>(t->data())[0] == 0.0f);
  CHECK(static_cast<const float*>(t->data())[1023] == 1023.0f);
  CHECK(released(count));
  finish_stream(api, device_ordinal, per_thread_stream());
}

}  // namespace dlasync::testing
