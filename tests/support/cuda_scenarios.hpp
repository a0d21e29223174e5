// Test support: import scenarios for GPUs, written against the CUDA seam so
// that the same code runs on simulated GPUs and on a real one.
#pragma once

#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "runtime/src/cuda/cuda_api.hpp"
#include "support/layouts.hpp"
#include "support/runtime_fixture.hpp"
#include "support/test_tensors.hpp"
#include "transfer/src/kernels/strided_copy.hpp"

namespace dlasync::testing {

inline cuda::stream_t legacy_stream() {
  return reinterpret_cast<cuda::stream_t>(1);
}

// Waits on the host for everything on `stream` of `device` (tests only).
inline void finish_stream(cuda::api& api, int device, cuda::stream_t stream) {
  REQUIRE(api.set_device(device) == cuda::error::success);
  cuda::event_t e = nullptr;
  REQUIRE(api.event_create(&e) == cuda::error::success);
  REQUIRE(api.event_record(e, stream) == cuda::error::success);
  REQUIRE(eventually([&] { return api.event_query(e) != cuda::error::not_ready; }));
  REQUIRE(api.event_query(e) == cuda::error::success);
  api.event_destroy(e);
}

// Device memory filled from `host`, freed on destruction.
struct device_memory {
  cuda::api& api;
  int device;
  void* data = nullptr;
  std::size_t bytes;
  device_memory(cuda::api& a, int d, const void* host, std::size_t n)
      : api(a), device(d), bytes(n) {
    REQUIRE(api.set_device(device) == cuda::error::success);
    REQUIRE(api.malloc_async(&data, n, legacy_stream()) == cuda::error::success);
    REQUIRE(api.memcpy_async(data, host, n, cuda::memcpy_kind::host_to_device, legacy_stream()) ==
            cuda::error::success);
    finish_stream(api, device, legacy_stream());
  }
  ~device_memory() {
    api.set_device(device);
    api.free_async(data, legacy_stream());
    finish_stream(api, device, legacy_stream());
  }
};

// The bytes of a compact tensor on a GPU, read back to the host.
inline std::vector<std::uint8_t> read_back(cuda::api& api, const tensor& t) {
  std::vector<std::uint8_t> out(t.byte_size());
  if (out.empty()) return out;
  api.set_device(t.device().ordinal);
  REQUIRE(api.memcpy_async(out.data(), t.data(), out.size(), cuda::memcpy_kind::device_to_host,
                           legacy_stream()) == cuda::error::success);
  finish_stream(api, t.device().ordinal, legacy_stream());
  return out;
}

// The bytes `c` reads from `first`, in row-major order.
inline std::vector<std::uint8_t> expected_bytes(const void* first, const layout_case& c,
                                                dtype type) {
  if (type.is_sub_byte()) {
    std::int64_t n = 1;
    for (std::int64_t e : c.shape) n *= e;
    const auto bytes = static_cast<std::size_t>((n * type.bits + 7) / 8);
    const auto* p = static_cast<const std::uint8_t*>(first);
    return {p, p + bytes};
  }
  const std::size_t es = type.bits / 8u;
  strided_layout l{es, {c.shape.begin(), c.shape.end()}, {}};
  std::int64_t s = 1;
  l.strides.resize(c.shape.size());
  for (std::size_t i = c.shape.size(); i-- > 0;) {
    l.strides[i] = c.strides ? (*c.strides)[i] : s;
    s *= c.shape[i];
  }
  strided_copy copy(l);
  std::vector<std::uint8_t> out(copy.bytes());
  copy.run(first, out.data(), 0, copy.units());
  return out;
}

inline absl::StatusOr<tensor> import_now(runtime& rt, managed_tensor& source,
                                         const import_options& o) {
  return async_import_dlpack(rt, source, o, asio::use_future).get();
}

// Host layouts of several dtypes onto GPU `target` through the pipeline.
// `pageable_copies`, when given, counts the runtime's pageable copies: the
// imports must make none (pageable sources go through pinned staging).
inline void scenario_host_to_gpu(runtime& rt, int target,
                                 const std::function<std::uint64_t()>& pageable_copies = {}) {
  for (const dtype type : supported_dtypes()) {
    for (const layout_case& c : layout_cases()) {
      if (type.is_sub_byte() && !c.sub_byte_ok) continue;
      INFO(type.name() << ", " << c.name);
      const layout_source layout(type, c);
      deleter_count count;
      managed_tensor source = make_tensor(layout.spec, count);
      import_options o;
      o.target = device{device_kind::cuda, target};
      const std::uint64_t pageable_before = pageable_copies ? pageable_copies() : 0;
      absl::StatusOr<tensor> t = import_now(rt, source, o);
      REQUIRE(t.ok());
      if (pageable_copies) CHECK(pageable_copies() == pageable_before);
      CHECK(t->device() == *o.target);
      CHECK(t->is_copy());
      CHECK(released(count));
      CHECK(read_back(*cuda_of(rt), *t) == expected_bytes(layout.first(), c, type));
    }
  }
}

// Pageable host memory onto cuda_host: DLPack's kDLCUDAHost promises
// page-locked memory, so the import copies (inline when small, on the
// workers when large, compacted when strided) into memory that CUDA itself
// reports page-locked: imported on to GPU `gpu`, it goes in one copy
// (pinned_to_gpu), not through the staging chunks. copy=false refuses,
// leaving the tensor with its owner; a source labelled cuda_host is viewed.
inline void scenario_host_to_page_locked(runtime& rt, int gpu) {
  const device pinned{device_kind::cuda_host, 0};
  for (const std::int64_t floats : {std::int64_t{1024}, std::int64_t{2} << 20}) {
    for (const bool strided : {false, true}) {
      INFO(floats * 4 << " bytes" << (strided ? ", every other element" : ""));
      std::vector<float> host(static_cast<std::size_t>(strided ? 2 * floats : floats));
      std::iota(host.begin(), host.end(), 0.5F);
      tensor_spec s;
      s.shape = {floats};
      if (strided) s.strides = std::vector<std::int64_t>{2};
      s.data = host.data();

      deleter_count kept;
      managed_tensor refused = make_tensor(s, kept);
      import_options no_copy;
      no_copy.target = pinned;
      no_copy.copy = false;
      absl::StatusOr<tensor> r = import_now(rt, refused, no_copy);
      require_status(r.status(), absl::StatusCode::kFailedPrecondition,
                     {"copy=false", "page-locked target", "cuda_host"});
      CHECK(import_error_of(r.status())->rule == "copy");
      CHECK_FALSE(refused.empty());
      CHECK(kept.calls == 0);

      deleter_count count;
      managed_tensor source = make_tensor(s, count);
      import_options o;
      o.target = pinned;
      absl::StatusOr<tensor> t = import_now(rt, source, o);
      REQUIRE(t.ok());
      CHECK(t->device() == pinned);
      CHECK(t->is_copy());
      CHECK(t->data() != static_cast<const void*>(host.data()));
      CHECK(released(count));
      const auto* out = static_cast<const float*>(t->data());
      bool same = true;
      for (std::int64_t i = 0; i < floats; ++i) {
        same = same && out[i] == host[static_cast<std::size_t>(strided ? 2 * i : i)];
      }
      CHECK(same);

      // CUDA's own pointer query calls the copy page-locked: one copy up.
      absl::StatusOr<DLManagedTensorVersioned*> exported = t->to_dlpack_versioned();
      REQUIRE(exported.ok());
      managed_tensor again(*exported);
      import_options up;
      up.target = device{device_kind::cuda, gpu};
      const std::uint64_t pinned_before = rt.stats().bytes.pinned_to_gpu;
      const std::uint64_t staged_before = rt.stats().bytes.pageable_to_gpu;
      absl::StatusOr<tensor> on_gpu = import_now(rt, again, up);
      REQUIRE(on_gpu.ok());
      CHECK(rt.stats().bytes.pinned_to_gpu ==
            pinned_before + static_cast<std::uint64_t>(floats) * 4);
      CHECK(rt.stats().bytes.pageable_to_gpu == staged_before);
      CHECK(read_back(*cuda_of(rt), *on_gpu) ==
            std::vector<std::uint8_t>(static_cast<const std::uint8_t*>(t->data()),
                                      static_cast<const std::uint8_t*>(t->data()) + floats * 4));

      // Labelled page-locked already: a view.
      tensor_spec p = s;
      p.device = pinned;
      p.strides.reset();
      p.data = t->data();
      deleter_count viewed;
      managed_tensor labelled = make_tensor(p, viewed);
      absl::StatusOr<tensor> view = import_now(rt, labelled, o);
      REQUIRE(view.ok());
      CHECK(view->is_view());
      CHECK(view->data() == t->data());
    }
  }
}

// Every layout and dtype of GPU memory back to the host, element by element.
inline void scenario_gpu_layouts_to_host(runtime& rt, int source_device) {
  for (const dtype type : supported_dtypes()) {
    for (const layout_case& c : layout_cases()) {
      if (type.is_sub_byte() && !c.sub_byte_ok) continue;
      INFO(type.name() << ", " << c.name);
      layout_source layout(type, c);
      device_memory mem(*cuda_of(rt), source_device, layout.bytes.data(), layout.bytes.size());
      tensor_spec s = layout.spec;
      s.device = {device_kind::cuda, source_device};
      s.data = mem.data;
      deleter_count count;
      managed_tensor source = make_tensor(s, count);
      import_options o;
      o.target = host_device;
      absl::StatusOr<tensor> t = import_now(rt, source, o);
      REQUIRE(t.ok());
      CHECK(t->is_copy());
      CHECK(t->is_compact());
      CHECK(released(count));
      CHECK(same_elements(*t, layout.first(), c, type));
    }
  }
}

// GPU memory, compact and transposed, back to the host.
inline void scenario_gpu_to_host(runtime& rt, int source_device) {
  std::vector<float> host(64 * 48);
  std::iota(host.begin(), host.end(), 0.0f);
  device_memory mem(*cuda_of(rt), source_device, host.data(), host.size() * sizeof(float));
  for (const bool transposed : {false, true}) {
    INFO((transposed ? "transposed" : "compact"));
    tensor_spec s;
    s.device = {device_kind::cuda, source_device};
    s.shape = transposed ? std::vector<std::int64_t>{48, 64} : std::vector<std::int64_t>{64, 48};
    if (transposed) s.strides = std::vector<std::int64_t>{1, 48};
    s.data = mem.data;
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.target = host_device;
    absl::StatusOr<tensor> t = import_now(rt, source, o);
    REQUIRE(t.ok());
    CHECK(t->device() == host_device);
    CHECK(released(count));
    const auto* out = static_cast<const float*>(t->data());
    bool same = true;
    for (int i = 0; i < static_cast<int>(s.shape[0]); ++i) {
      for (int j = 0; j < static_cast<int>(s.shape[1]); ++j) {
        const float want = transposed ? host[j * 48 + i] : host[i * 48 + j];
        same = same && out[i * s.shape[1] + j] == want;
      }
    }
    CHECK(same);
  }
}

// On one GPU: a view, a copy, a compaction; then across to the other GPU.
inline void scenario_gpu_to_gpu(runtime& rt, int first, int second) {
  std::vector<std::int32_t> host(32 * 16);
  std::iota(host.begin(), host.end(), 0);
  device_memory mem(*cuda_of(rt), first, host.data(), host.size() * 4);
  auto make = [&](bool transposed, deleter_count& count) {
    tensor_spec s;
    s.device = {device_kind::cuda, first};
    s.type = dtypes::int32;
    s.shape = transposed ? std::vector<std::int64_t>{16, 32} : std::vector<std::int64_t>{32, 16};
    if (transposed) s.strides = std::vector<std::int64_t>{1, 16};
    s.data = mem.data;
    return make_tensor(s, count);
  };
  std::vector<std::int32_t> transposed(host.size());
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 32; ++j) transposed[i * 32 + j] = host[j * 16 + i];
  }
  auto as_bytes = [](const std::vector<std::int32_t>& v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
    return std::vector<std::uint8_t>(p, p + v.size() * 4);
  };
  {
    deleter_count count;
    managed_tensor source = make(false, count);
    absl::StatusOr<tensor> view = import_now(rt, source, {});
    REQUIRE(view.ok());
    CHECK(view->is_view());
    CHECK(view->data() == mem.data);
  }
  for (const int target : {first, second}) {
    for (const bool strided : {false, true}) {
      INFO("to cuda:" << target << (strided ? ", transposed" : ""));
      deleter_count count;
      managed_tensor source = make(strided, count);
      import_options o;
      o.target = device{device_kind::cuda, target};
      o.copy = true;
      o.require_contiguous = true;
      absl::StatusOr<tensor> t = import_now(rt, source, o);
      REQUIRE(t.ok());
      CHECK(t->device() == *o.target);
      CHECK(released(count));
      CHECK(read_back(*cuda_of(rt), *t) == as_bytes(strided ? transposed : host));
    }
  }
}

// A producer that is slow on the device itself: `stream` (of `device`,
// which must be current) first holds for `delay` in a host function, then
// copies `values` from page-locked memory into `dst`. Nothing here waits on
// the host (a pageable source could make the copy synchronous); `staging`
// keeps the page-locked copy of `values` until the caller has waited.
struct slow_device_write {
  cuda::api& api;
  void* staging = nullptr;

  slow_device_write(cuda::api& a, cuda::stream_t stream, void* dst,
                    const std::vector<float>& values, std::chrono::milliseconds delay)
      : api(a) {
    const std::size_t bytes = values.size() * sizeof(float);
    REQUIRE(api.malloc_host(&staging, bytes) == cuda::error::success);
    std::memcpy(staging, values.data(), bytes);
    REQUIRE(api.launch_host_func(stream, [delay] { std::this_thread::sleep_for(delay); }) ==
            cuda::error::success);
    REQUIRE(api.memcpy_async(dst, staging, bytes, cuda::memcpy_kind::host_to_device, stream) ==
            cuda::error::success);
  }
  // Call once the write is known complete.
  ~slow_device_write() { (void)api.free_host(staging); }
  slow_device_write(const slow_device_write&) = delete;
  slow_device_write& operator=(const slow_device_write&) = delete;
};

// The producer writes on its stream after a delay on the device (a host
// function holding the stream, then a copy from page-locked memory); the
// import must see the final data, for a copy to the host and for a view,
// without the host waiting for the producer first.
inline void scenario_producer_stream(runtime& rt, int device_ordinal,
                                     std::chrono::milliseconds delay) {
  cuda::api& api = *cuda_of(rt);
  std::vector<float> stale(1024, -1.0f);
  std::vector<float> fresh(1024);
  std::iota(fresh.begin(), fresh.end(), 0.0f);
  device_memory mem(api, device_ordinal, stale.data(), stale.size() * 4);
  REQUIRE(api.set_device(device_ordinal) == cuda::error::success);
  cuda::stream_t producer = nullptr;
  REQUIRE(api.stream_create(&producer, cuda::stream_flags::non_blocking) == cuda::error::success);
  for (const bool to_host : {true, false}) {
    INFO((to_host ? "copy to the host" : "view"));
    slow_device_write write(api, producer, mem.data, to_host ? fresh : stale, delay);
    tensor_spec s;
    s.device = {device_kind::cuda, device_ordinal};
    s.shape = {1024};
    s.data = mem.data;
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.stream = reinterpret_cast<std::int64_t>(producer);
    if (to_host) o.target = host_device;
    const auto called = std::chrono::steady_clock::now();
    absl::StatusOr<tensor> t = import_now(rt, source, o);
    REQUIRE(t.ok());
    // The import could only finish after the producer's delay on the
    // device: the ordering was tested, not skipped by a host wait.
    CHECK(std::chrono::steady_clock::now() - called >= delay / 2);
    if (to_host) {
      CHECK(static_cast<const float*>(t->data())[1023] == 1023.0f);
      CHECK(released(count));
    } else {
      CHECK(t->is_view());
      const std::vector<std::uint8_t> now = read_back(api, *t);
      CHECK(std::memcmp(now.data(), stale.data(), now.size()) == 0);
    }
    finish_stream(api, device_ordinal, producer);
  }
  finish_stream(api, device_ordinal, producer);
  api.stream_destroy(producer);
}

// Managed memory of GPU `device_ordinal`: viewed in place on that GPU and as
// itself, copied to the host and to GPU `other`, compacted when strided, and
// refused where a copy would have to land in it or where the pointer is not
// managed memory.
inline void scenario_managed(runtime& rt, int device_ordinal, int other) {
  cuda::api& api = *cuda_of(rt);
  REQUIRE(api.set_device(device_ordinal) == cuda::error::success);
  void* managed = nullptr;
  REQUIRE(api.malloc_managed(&managed, 4096 * sizeof(float)) == cuda::error::success);
  auto* values = static_cast<float*>(managed);
  std::iota(values, values + 4096, 0.0f);
  const device where{device_kind::cuda_managed, device_ordinal};

  for (const std::optional<device> target :
       {std::optional<device>(device{device_kind::cuda, device_ordinal}),
        std::optional<device>()}) {
    INFO("view on " << (target ? target->name() : where.name()));
    tensor_spec s;
    s.device = where;
    s.shape = {4096};
    s.data = managed;
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.target = target;
    absl::StatusOr<tensor> t = import_now(rt, source, o);
    REQUIRE(t.ok());
    CHECK(t->is_view());
    CHECK(t->data() == managed);
    CHECK(t->device() == target.value_or(where));
    t = absl::UnknownError("dropped");
    CHECK(count.calls == 1);
  }
  {
    INFO("a copy to the host");
    tensor_spec s;
    s.device = where;
    s.shape = {64, 64};
    s.data = managed;
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.target = host_device;
    absl::StatusOr<tensor> t = import_now(rt, source, o);
    REQUIRE(t.ok());
    CHECK(t->is_copy());
    CHECK(std::memcmp(t->data(), managed, 4096 * sizeof(float)) == 0);
    CHECK(released(count));
  }
  {
    INFO("a strided copy to the other GPU, compacted");
    tensor_spec s;
    s.device = where;
    s.shape = {2048};
    s.strides = std::vector<std::int64_t>{2};
    s.data = managed;
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.target = device{device_kind::cuda, other};
    o.require_contiguous = true;
    absl::StatusOr<tensor> t = import_now(rt, source, o);
    REQUIRE(t.ok());
    CHECK(t->is_copy());
    const std::vector<std::uint8_t> bytes = read_back(api, *t);
    std::vector<float> expected(2048);
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<float>(2 * i);
    REQUIRE(bytes.size() == expected.size() * sizeof(float));
    CHECK(std::memcmp(bytes.data(), expected.data(), bytes.size()) == 0);
    CHECK(eventually([&] { return count.calls == 1; }));
  }
  {
    INFO("copy=true without a target would place a copy in managed memory");
    tensor_spec s;
    s.device = where;
    s.shape = {16};
    s.data = managed;
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    import_options o;
    o.copy = true;
    require_status(import_now(rt, source, o).status(), absl::StatusCode::kUnimplemented,
                   {"cuda_managed", "pass a target"});
    CHECK(count.calls == 0);
    CHECK_FALSE(source.empty());
  }
  {
    INFO("device memory that claims to be managed");
    std::vector<float> host(16, 1.0f);
    device_memory mem(api, device_ordinal, host.data(), 64);
    tensor_spec s;
    s.device = where;
    s.shape = {16};
    s.data = mem.data;
    deleter_count count;
    managed_tensor source = make_tensor(s, count);
    require_status(import_now(rt, source, {}).status(), absl::StatusCode::kFailedPrecondition,
                   {where.name().c_str(), "cuda:"});
    CHECK(count.calls == 0);
  }
  api.set_device(device_ordinal);
  REQUIRE(api.free_device(managed) == cuda::error::success);
}

}  // namespace dlasync::testing
