// libFuzzer target: managed tensors, legacy and versioned, built from the
// input bytes (version, flags, device, ndim, shape, strides, dtype, byte
// offset, where the data lies and how much backing memory there is), then
// validated and imported onto host and simulated-GPU devices with fuzzed
// options.
//
// What must hold for every input (else the target traps):
//   - an import refused up front leaves the tensor with its owner, deleter
//     not called; a consumed one has its deleter called exactly once;
//   - the import's verdict agrees with plan_import's;
//   - an accepted import's elements equal the source's, element by element;
//   - no sanitizer report, no hang (libFuzzer's -timeout).
// Only tensors whose bytes lie inside their backing memory are imported;
// validation cannot know the size of the memory behind a pointer, so it is
// fuzzed on all of them.
#include <fuzzer/FuzzedDataProvider.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "asio/use_future.hpp"
#include "dlasync/dlasync.hpp"
#include "support/sim_runtime.hpp"

namespace {

using namespace dlasync;

constexpr std::size_t region_bytes = 64 << 10;
constexpr std::uint64_t memory_limit = 32 << 20;

// Memory the tensors point into: host, pinned, two GPUs, managed.
struct environment {
  std::shared_ptr<cuda::sim_api> sim;
  std::unique_ptr<runtime> rt;
  void* regions[5] = {};
  cuda::stream_t streams[2] = {};
};

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_import: %s\n", what);
  __builtin_trap();
}

// Waits for the work on the caller's stream `s`. A stream value that is no
// stream of `d` (a fuzzed one) could not be ordered on the device either:
// the import then resumed when the data was ready.
void wait_for_stream(cuda::api& api, int d, cuda::stream_t s) {
  api.set_device(d);
  cuda::event_t ev = nullptr;
  if (api.event_create(&ev) != cuda::error::success) fail("event");
  if (api.event_record(ev, s) == cuda::error::success) {
    while (api.event_query(ev) == cuda::error::not_ready) std::this_thread::yield();
  }
  api.event_destroy(ev);
}

environment& env() {
  static environment* e = [] {
    auto* out = new environment;
    cuda::sim_options so;
    so.devices = 2;
    so.memory_per_device = memory_limit;
    so.min_sleep_us = 1e9;  // no simulated time: copies run at once
    // Rules and races are checked; reports are collected and judged after
    // each input (see simulation_findings).
    so.check_order = true;
    so.on_report = cuda::report_action::collect;
    absl::StatusOr<testing::sim_runtime> made =
        testing::build_sim_runtime(so, [](runtime_options& o) {
          o.topology = process_topology::single_process(2);
          o.copy_memory_budget = memory_limit;
          o.staging_chunks = 2;
          o.staging_chunk_bytes = 16 << 10;
        });
    if (!made.ok()) fail("the runtime could not be made");
    out->sim = std::move(made->sim);
    out->rt = std::move(made->rt);
    cuda::api& api = *out->sim;
    out->regions[0] = std::aligned_alloc(4096, region_bytes);
    if (api.malloc_host(&out->regions[1], region_bytes) != cuda::error::success) fail("pinned");
    for (int d = 0; d < 2; ++d) {
      api.set_device(d);
      if (api.stream_create(&out->streams[d], cuda::stream_flags::non_blocking) !=
          cuda::error::success)
        fail("stream");
      if (api.malloc_async(&out->regions[2 + d], region_bytes, out->streams[d]) !=
          cuda::error::success) {
        fail("device memory");
      }
      // Usable on other streams once the host has seen the allocation.
      wait_for_stream(api, d, out->streams[d]);
    }
    api.set_device(0);
    if (api.malloc_managed(&out->regions[4], region_bytes) != cuda::error::success) fail("managed");
    // Simulated device memory is host memory: fill every region directly.
    for (void* r : out->regions) {
      auto* bytes = static_cast<unsigned char*>(r);
      for (std::size_t i = 0; i < region_bytes; ++i)
        bytes[i] = static_cast<unsigned char>(i * 131 + 7);
    }
    return out;
  }();
  return *e;
}

std::int64_t pick_extent(FuzzedDataProvider& in, bool stride) {
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0: return in.ConsumeIntegralInRange<std::int64_t>(0, 9);
    case 1: return stride ? in.ConsumeIntegralInRange<std::int64_t>(-9, 9) : 1;
    case 2: return -1;
    case 3: return std::int64_t{1} << in.ConsumeIntegralInRange<int>(20, 62);
    case 4: return std::numeric_limits<std::int64_t>::max();
    case 5: return std::numeric_limits<std::int64_t>::min();
    default: return in.ConsumeIntegral<std::int64_t>();
  }
}

std::optional<std::int64_t> pick_stream(FuzzedDataProvider& in, const environment& e) {
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0: return std::nullopt;
    case 1: return -1;
    case 2: return 0;
    case 3: return in.ConsumeIntegralInRange<std::int64_t>(1, 2);
    case 4: return reinterpret_cast<std::int64_t>(e.streams[0]);
    case 5: return reinterpret_cast<std::int64_t>(e.streams[1]);
    default: return in.ConsumeIntegral<std::int64_t>();
  }
}

std::optional<device> pick_device(FuzzedDataProvider& in) {
  static constexpr device choices[] = {
      {device_kind::cpu, 0},  {device_kind::cpu, 1},          {device_kind::cuda, 0},
      {device_kind::cuda, 1}, {device_kind::cuda_host, 0},    {device_kind::cuda_managed, 0},
      {device_kind::cuda, 2}, {device_kind::cuda_managed, 1}, {device_kind::rocm, 0}};
  const int k = in.ConsumeIntegralInRange<int>(0, 10);
  if (k == 9) return std::nullopt;
  if (k == 10) {
    return device{static_cast<device_kind>(in.ConsumeIntegralInRange<std::int32_t>(-2, 40)),
                  in.ConsumeIntegralInRange<std::int32_t>(-2, 4)};
  }
  return choices[k];
}

bool eventually(const std::atomic<int>& count, int value) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (count.load() != value) {
    if (count.load() > value || std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

// Element i (row-major order) of the source equals element i of `t`.
void check_elements(const tensor& t, std::uintptr_t first, std::span<const std::int64_t> shape,
                    std::span<const std::int64_t> strides, std::size_t element_bytes) {
  const auto* dst = static_cast<const unsigned char*>(t.data());
  std::vector<std::int64_t> index(shape.size(), 0);
  const std::int64_t n = t.element_count();
  for (std::int64_t i = 0; i < n && i < (1 << 16); ++i) {
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) offset += index[d] * strides[d];
    // NOLINTNEXTLINE(performance-no-int-to-ptr): the source's address, walked as validation does
    const auto* src = reinterpret_cast<const unsigned char*>(
        first + static_cast<std::uintptr_t>(offset * static_cast<std::int64_t>(element_bytes)));
    // A view keeps the source's strides; a copy is compact.
    std::int64_t at = i;
    if (t.is_view()) at = offset;
    if (std::memcmp(src, dst + at * static_cast<std::int64_t>(element_bytes), element_bytes) != 0) {
      fail("an imported element differs from the source");
    }
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

int run(FuzzedDataProvider& in, environment& e, bool versioned) {
  std::atomic<int> count{0};
  tensor_description d;
  DLPackVersion version{1, 3};
  if (versioned) {
    version.major = in.ConsumeIntegralInRange<std::uint32_t>(0, 3);
    version.minor = in.ConsumeIntegral<std::uint8_t>();
    d.flags = in.ConsumeIntegral<std::uint8_t>();
  }
  d.device.kind = static_cast<device_kind>(in.ConsumeIntegralInRange<std::int32_t>(-1, 21));
  d.device.ordinal = in.ConsumeIntegralInRange<std::int32_t>(-1, 3);
  const std::int32_t ndim = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::int32_t>(0, 4)
                                             : in.ConsumeIntegralInRange<std::int32_t>(-2, 66);
  const std::size_t dims = static_cast<std::size_t>(std::clamp(ndim, 0, 66));
  for (std::size_t i = 0; i < dims; ++i) d.shape.push_back(pick_extent(in, false));
  if (in.ConsumeBool()) {
    d.strides.emplace();
    for (std::size_t i = 0; i < dims; ++i) d.strides->push_back(pick_extent(in, true));
  }
  const bool null_shape = in.ConsumeIntegralInRange<int>(0, 31) == 0;
  static constexpr std::uint8_t bits_choices[] = {1, 4, 6, 8, 16, 32, 64, 128, 0, 12};
  d.dtype.code = in.ConsumeIntegralInRange<std::uint8_t>(0, 20);
  d.dtype.bits = in.ConsumeBool() ? bits_choices[in.ConsumeIntegralInRange<int>(0, 9)]
                                  : in.ConsumeIntegral<std::uint8_t>();
  d.dtype.lanes = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<std::uint16_t>()
                                                            : std::uint16_t{1};
  const int region = in.ConsumeIntegralInRange<int>(0, 5);  // 5: no memory
  const std::size_t offset = in.ConsumeIntegralInRange<std::size_t>(0, region_bytes);
  d.data = region == 5 ? nullptr : static_cast<char*>(e.regions[region]) + offset;
  d.byte_offset = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::uint64_t>(0, 256)
                                   : in.ConsumeIntegral<std::uint64_t>();
  const std::vector<std::int64_t> shape = d.shape;
  const std::vector<std::int64_t> strides = d.strides.value_or(std::vector<std::int64_t>());
  // The public producer helper, then what a producer may get wrong: the
  // version, an ndim that disagrees with the shape, a NULL shape.
  managed_tensor source = make_managed_tensor(
      std::move(d), [&count] { count.fetch_add(1); },
      versioned ? dlpack_abi::versioned : dlpack_abi::legacy);
  if (versioned) source.versioned()->version = version;
  DLTensor& dl = versioned ? source.versioned()->dl_tensor : source.legacy()->dl_tensor;
  dl.ndim = ndim;
  if (null_shape) dl.shape = nullptr;

  import_options options;
  options.target = pick_device(in);
  const int copy = in.ConsumeIntegralInRange<int>(0, 2);
  if (copy != 0) options.copy = copy == 1;
  options.stream = pick_stream(in, e);
  options.consumer_stream = pick_stream(in, e);
  options.require_contiguous = in.ConsumeBool();
  options.require_writable = in.ConsumeBool();
  options.min_alignment = in.ConsumeBool() ? std::size_t{1} << in.ConsumeIntegralInRange<int>(0, 12)
                                           : in.ConsumeIntegral<std::uint16_t>();

  const absl::StatusOr<import_plan> plan = plan_import(source, options, e.rt->registry());
  bool inside = false;
  if (plan.ok()) {
    if (plan->element_count == 0) {
      inside = true;
    } else if (region != 5) {
      const auto base = reinterpret_cast<std::uintptr_t>(e.regions[region]);
      const std::uintptr_t low = plan->address + static_cast<std::uintptr_t>(plan->span_begin);
      const std::uintptr_t high = plan->address + static_cast<std::uintptr_t>(plan->span_end);
      inside = plan->span_begin <= 0 && plan->address >= base &&
               static_cast<std::uintptr_t>(-plan->span_begin) <= plan->address - base &&
               low >= base && high >= low && high <= base + region_bytes;
    }
  }
  if (plan.ok() && !inside) {
    // Valid, but it would read past its memory: validation alone is checked.
    source.reset();
    if (count.load() != 1) fail("deleter not called exactly once on reset");
    return 0;
  }

  if (std::getenv("DLASYNC_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "region %d, address %#llx, dtype %s, ndim %d, shape", region,
                 static_cast<unsigned long long>(plan.ok() ? plan->address : 0),
                 dtype::from_dl(dl.dtype).name().c_str(), ndim);
    for (std::int64_t x : shape) std::fprintf(stderr, " %lld", static_cast<long long>(x));
    std::fprintf(stderr, ", strides");
    for (std::int64_t x : strides) std::fprintf(stderr, " %lld", static_cast<long long>(x));
    std::fprintf(stderr, "; target %s, copy %d, stream %lld, consumer %lld; plan: %s\n",
                 options.target ? options.target->name().c_str() : "none", copy,
                 static_cast<long long>(options.stream.value_or(-7)),
                 static_cast<long long>(options.consumer_stream.value_or(-7)),
                 plan.ok() ? plan->copy_reason_text().c_str() : plan.status().ToString().c_str());
  }
  absl::StatusOr<tensor> result =
      async_import_dlpack(*e.rt, source, options, asio::use_future).get();
  if (!plan.ok()) {
    if (result.ok()) fail("the import accepted what plan_import refused");
    if (source.empty() || count.load() != 0) fail("a refused tensor was consumed");
  }
  if (result.ok()) {
    if (!source.empty()) fail("an accepted tensor was not consumed");
    if (options.consumer_stream && *options.consumer_stream != stream_no_sync &&
        plan->target.kind == device_kind::cuda) {
      // The event goes on the stream's own device, which may not be the
      // target's: a wait across devices is allowed, a record is not.
      // NOLINTNEXTLINE(performance-no-int-to-ptr): DLPack's encoding of a stream
      const auto consumer = reinterpret_cast<cuda::stream_t>(*options.consumer_stream);
      const int device = consumer == e.streams[1]   ? 1
                         : consumer == e.streams[0] ? 0
                                                    : plan->target.ordinal;
      wait_for_stream(*e.sim, device, consumer);
    }
    if (!plan->type.is_sub_byte()) {
      check_elements(*result, plan->address, shape,
                     strides.empty() ? std::span<const std::int64_t>(result->strides())
                                     : std::span<const std::int64_t>(strides),
                     plan->type.padded_size());
    }
  } else if (!source.empty() && count.load() != 0) {
    fail("a tensor left with its owner had its deleter called");
  }
  result = absl::UnknownError("dropped");
  source.reset();
  if (!eventually(count, 1)) fail("deleter not called exactly once");
  return 0;
}

// Fails on any report of the simulation but one: a stream value that names
// no stream, which the input itself may pass (a producer's bad handle is
// undefined behaviour on a GPU; the simulation names it, as it should).
void simulation_findings(cuda::sim_api& sim) {
  for (const std::string& r : sim.take_reports()) {
    if (r.find("rule: ") != std::string::npos &&
        r.find("the stream handle names no live stream") != std::string::npos) {
      continue;
    }
    std::fprintf(stderr, "fuzz_import: %s\n", r.c_str());
    fail("the simulated CUDA runtime reported a broken rule or a race");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  environment& e = env();
  const bool versioned = in.ConsumeBool();
  const int result = run(in, e, versioned);
  simulation_findings(*e.sim);
  return result;
}
