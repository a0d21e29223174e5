// The transfer plan as a pure function: every path and every refusal, with
// a pointer query of the test's own and no runtime.
#include "transfer/src/plan/transfer_plan.hpp"

#include <cstdint>
#include <optional>
#include <vector>

#include "catch2/catch.hpp"
#include "dlasync/import.hpp"
#include "runtime/src/device_registry_factory.hpp"
#include "support/test_tensors.hpp"

namespace dlasync::detail {
namespace {

using testing::deleter_count;
using testing::make_tensor;
using testing::require_status;
using testing::tensor_spec;

constexpr device cuda0{device_kind::cuda, 0};
constexpr device cuda1{device_kind::cuda, 1};
constexpr device cpu1{device_kind::cpu, 1};

// Memory the fake pointer query knows: each array is "owned" by a device.
alignas(64) float gpu0_memory[256];
alignas(64) float gpu1_memory[256];
alignas(64) float pinned_memory[256];
alignas(64) float pageable_memory[256];

template <std::size_t N>
bool inside(const void* p, const float (&a)[N]) {
  const auto* c = static_cast<const char*>(p);
  return c >= reinterpret_cast<const char*>(a) && c < reinterpret_cast<const char*>(a + N);
}

absl::StatusOr<std::optional<device>> where_is(const void* p) {
  if (inside(p, gpu0_memory)) return std::optional<device>(cuda0);
  if (inside(p, gpu1_memory)) return std::optional<device>(cuda1);
  if (inside(p, pinned_memory)) return std::optional<device>(device{device_kind::cuda_host, 0});
  return std::optional<device>();
}

absl::StatusOr<std::optional<device>> query_fails(const void*) {
  return absl::InternalError("cudaPointerGetAttributes failed: driver shutting down");
}

// Two CPUs and two GPUs (with their managed and pinned memory).
device_registry gpu_registry() {
  std::vector<served_devices> served = host_backend_devices(2);
  served.push_back({"cuda (simulated)", device_kind::cuda, 2, true});
  served.push_back({"cuda (simulated)", device_kind::cuda_managed, 2, true});
  absl::StatusOr<device_registry> r = detail::device_registry_factory::create(
      process_topology::single_process(2), std::move(served));
  REQUIRE(r.ok());
  return *std::move(r);
}

struct planned {
  deleter_count count;
  managed_tensor tensor;
  import_plan plan;
};

// Validates `spec` against `options` on the GPU registry.
void plan_of(planned& p, const tensor_spec& spec, const import_options& options) {
  static const device_registry registry = gpu_registry();
  p.tensor = make_tensor(spec, p.count);
  absl::StatusOr<import_plan> plan = plan_import(p.tensor, options, registry);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  p.plan = *plan;
}

tensor_spec matrix(device on, float* data, std::vector<std::int64_t> shape = {8, 16}) {
  tensor_spec s;
  s.device = on;
  s.data = data;
  s.shape = std::move(shape);
  return s;
}

transfer_facts gpu_facts(std::uint64_t chunk_bytes = 1 << 20, std::uint64_t budget = 0) {
  transfer_facts f;
  f.locate.emplace(where_is);
  f.chunk_bytes = chunk_bytes;
  f.budget_limit = budget;
  return f;
}

transfer_plan require_path(const transfer_facts& facts, const tensor_spec& spec,
                           const import_options& options, transfer_path expected) {
  planned p;
  plan_of(p, spec, options);
  transfer_plan t;
  const absl::Status s = plan_transfer(facts, p.plan, *p.tensor.dl_tensor(), t);
  INFO(s.ToString());
  REQUIRE(s.ok());
  CHECK(t.path == expected);
  return t;
}

import_options onto(device target, std::optional<bool> copy = std::nullopt) {
  import_options o;
  o.target = target;
  o.copy = copy;
  return o;
}

void require_refusal(const transfer_facts& facts, const tensor_spec& spec,
                     const import_options& options, absl::StatusCode code, const char* rule,
                     std::initializer_list<const char*> words) {
  planned p;
  plan_of(p, spec, options);
  transfer_plan t;
  const absl::Status s = plan_transfer(facts, p.plan, *p.tensor.dl_tensor(), t);
  require_status(s, code, words);
  const std::optional<import_error> e = import_error_of(s);
  REQUIRE(e.has_value());
  CHECK(e->rule == rule);
  CHECK_FALSE(e->consumed);
  CHECK(p.count.calls == 0);  // planning takes nothing
}

}  // namespace

TEST_CASE("the plan's views read nothing and hold no budget", "[transfer][plan]") {
  const transfer_plan v =
      require_path(gpu_facts(), matrix(host_device, pageable_memory), {}, transfer_path::view);
  CHECK(v.hold_bytes == 0);
  CHECK(v.layout.shape.empty());
  CHECK(v.stream_device == host_device);

  import_options follow = onto(cuda0);
  follow.stream = 1;  // the legacy default stream of the source GPU
  const transfer_plan w = require_path(gpu_facts(), matrix(cuda0, gpu0_memory), follow,
                                       transfer_path::view_after_producer);
  CHECK(w.hold_bytes == 0);
  CHECK(w.stream_device == cuda0);
}

TEST_CASE("the plan chooses each copy path from the devices and the pointer query",
          "[transfer][plan]") {
  const transfer_facts facts = gpu_facts();
  const std::uint64_t bytes = 8 * 16 * 4;

  const transfer_plan h = require_path(facts, matrix(host_device, pageable_memory), onto(cpu1),
                                       transfer_path::host_to_host);
  CHECK(h.hold_bytes == bytes);
  CHECK(h.stream_device == cpu1);

  require_path(facts, matrix(host_device, pinned_memory), onto(cuda1),
               transfer_path::pinned_to_gpu);
  // Pinned memory the tensor names as such goes the same way.
  require_path(facts, matrix({device_kind::cuda_host, 0}, pinned_memory), onto(cuda1),
               transfer_path::pinned_to_gpu);
  require_path(facts, matrix(host_device, pageable_memory), onto(cuda0),
               transfer_path::pageable_to_gpu);
  // Pinned but strided: gathered through the staging chunks.
  tensor_spec strided = matrix(host_device, pinned_memory, {8, 8});
  strided.strides = std::vector<std::int64_t>{1, 8};
  require_path(facts, strided, onto(cuda0), transfer_path::pageable_to_gpu);

  const transfer_plan down = require_path(facts, matrix(cuda1, gpu1_memory), onto(host_device),
                                          transfer_path::gpu_to_host);
  CHECK(down.stream_device == cuda1);  // the source GPU carries a download
  CHECK(down.hold_bytes == bytes);

  const transfer_plan within =
      require_path(facts, matrix(cuda0, gpu0_memory), onto(cuda0, true), transfer_path::within_gpu);
  CHECK(within.stream_device == cuda0);
  const transfer_plan across =
      require_path(facts, matrix(cuda0, gpu0_memory), onto(cuda1), transfer_path::gpu_to_gpu);
  CHECK(across.stream_device == cuda1);
}

TEST_CASE("the plan holds the simplified layout the copy reads", "[transfer][plan]") {
  const transfer_facts facts = gpu_facts();
  // A transpose with unit dimensions: [4, 1, 8] read column-major.
  tensor_spec t = matrix(host_device, pageable_memory, {4, 1, 8});
  t.strides = std::vector<std::int64_t>{1, 1000, 4};
  const transfer_plan p = require_path(facts, t, onto(cpu1), transfer_path::host_to_host);
  CHECK(p.layout.element_size == 4);
  CHECK(p.layout.shape == absl::InlinedVector<std::int64_t, 8>{4, 8});
  CHECK(p.layout.strides == absl::InlinedVector<std::int64_t, 8>{1, 4});
  // A compact tensor is one run.
  const transfer_plan c = require_path(facts, matrix(host_device, pageable_memory, {2, 3, 4}),
                                       onto(cpu1), transfer_path::host_to_host);
  CHECK(c.layout.shape == absl::InlinedVector<std::int64_t, 8>{24});
  CHECK(c.layout.strides == absl::InlinedVector<std::int64_t, 8>{1});
}

TEST_CASE("without a CUDA backend the plan asks no pointer query", "[transfer][plan]") {
  transfer_facts none;  // no locate
  require_path(none, matrix(cuda0, gpu1_memory), onto(cuda1), transfer_path::gpu_to_gpu);
}

TEST_CASE("the plan refuses GPU memory that is not where the tensor says", "[transfer][plan]") {
  const transfer_facts facts = gpu_facts();
  // Says cuda:0, lies on cuda:1.
  require_refusal(facts, matrix(cuda0, gpu1_memory), onto(cuda0, true),
                  absl::StatusCode::kFailedPrecondition, "location",
                  {"says it lives on cuda:0", "memory of cuda:1", "fix its DLDevice"});
  // Says cuda:0, is not CUDA memory at all: refused even for a view.
  require_refusal(facts, matrix(cuda0, pageable_memory), onto(cuda0),
                  absl::StatusCode::kFailedPrecondition, "location", {"not CUDA device memory"});
  // Says host memory bound for a GPU, is GPU memory.
  require_refusal(facts, matrix(host_device, gpu0_memory), onto(cuda1),
                  absl::StatusCode::kFailedPrecondition, "location",
                  {"says it lives on cpu:0", "memory of cuda:0"});
}

TEST_CASE("a failed pointer query is the plan's refusal", "[transfer][plan]") {
  transfer_facts facts = gpu_facts();
  facts.locate.emplace(query_fails);
  require_refusal(
      facts, matrix(cuda0, gpu0_memory), onto(host_device), absl::StatusCode::kInternal, "location",
      {"cannot tell where the data of a tensor on cuda:0 lives", "driver shutting down"});
  require_refusal(facts, matrix(host_device, pageable_memory), onto(cuda0),
                  absl::StatusCode::kInternal, "location", {"cannot tell where"});
  // A host copy asks nothing, so nothing fails.
  require_path(facts, matrix(host_device, pageable_memory), onto(cpu1),
               transfer_path::host_to_host);
}

TEST_CASE("the plan refuses a strided upload whose row is larger than a chunk",
          "[transfer][plan]") {
  // A transpose of 16 x 16 floats copies in tiles, whose rows (16 floats of
  // the tile dimension's neighbours) cannot be cut below 64 bytes.
  tensor_spec t = matrix(host_device, pageable_memory, {16, 16});
  t.strides = std::vector<std::int64_t>{1, 16};
  require_refusal(
      gpu_facts(32), t, onto(cuda0), absl::StatusCode::kUnimplemented, "staging",
      {"larger than a staging chunk of 32 bytes", "not consumed", "staging_chunk_bytes"});
  require_path(gpu_facts(4096), t, onto(cuda0), transfer_path::pageable_to_gpu);
  // A transpose of 8 x 4096 floats: each row along the tile dimension is
  // 16 KiB, read as one unit.
  static float wide[8 * 4096];
  tensor_spec rows = matrix(host_device, wide, {8, 4096});
  rows.strides = std::vector<std::int64_t>{1, 8};
  require_refusal(gpu_facts(16384 - 4), rows, onto(cuda0), absl::StatusCode::kUnimplemented,
                  "staging", {"chunk of 16380 bytes"});
  require_path(gpu_facts(16384), rows, onto(cuda0), transfer_path::pageable_to_gpu);
  // A compact upload is cut to fit any chunk.
  require_path(gpu_facts(32), matrix(host_device, pageable_memory), onto(cuda0),
               transfer_path::pageable_to_gpu);
}

TEST_CASE("the plan refuses a copy larger than the whole budget, not a view", "[transfer][plan]") {
  const std::uint64_t bytes = 8 * 16 * 4;
  require_refusal(
      gpu_facts(1 << 20, bytes - 1), matrix(host_device, pageable_memory), onto(cpu1),
      absl::StatusCode::kResourceExhausted, "budget",
      {"a copy needs 512 bytes", "budget of 511 bytes", "copy_memory_budget", "import a view"});
  require_path(gpu_facts(1 << 20, bytes), matrix(host_device, pageable_memory), onto(cpu1),
               transfer_path::host_to_host);
  require_path(gpu_facts(1 << 20, 1), matrix(host_device, pageable_memory), {},
               transfer_path::view);
}

TEST_CASE("check_budget is one rule for imports, batches and remote imports", "[transfer][plan]") {
  CHECK(check_budget("a copy", 100, 0).ok());  // 0: unlimited
  CHECK(check_budget("a copy", 100, 100).ok());
  const absl::Status over = check_budget("this batch of 3 tensors", 300, 299, "import less");
  require_status(over, absl::StatusCode::kResourceExhausted,
                 {"this batch of 3 tensors needs 300 bytes", "budget of 299 bytes", "not consumed",
                  ", or import less"});
  const std::optional<import_error> e = import_error_of(over);
  REQUIRE(e.has_value());
  CHECK(e->rule == "budget");
  CHECK_FALSE(e->consumed);
}

TEST_CASE("the producer's GPU and the staging pieces", "[transfer][plan]") {
  import_plan p;
  p.source = cuda1;
  p.target = host_device;
  CHECK(producer_gpu(p) == 1);
  p.source = {device_kind::cuda_host, 0};
  p.target = cuda1;
  CHECK(producer_gpu(p) == 1);
  p.target = host_device;
  CHECK(producer_gpu(p) == 0);

  const std::uint64_t chunk = 4 << 20;
  CHECK(staging_piece_bytes(64 << 20, chunk) == chunk);       // eight chunks or more
  CHECK(staging_piece_bytes(8 << 20, chunk) == 1 << 20);      // cut into eight
  CHECK(staging_piece_bytes(1 << 20, chunk) == 256 << 10);    // at least 256 KiB
  CHECK(staging_piece_bytes(1 << 20, 64 << 10) == 64 << 10);  // never above a chunk
}

}  // namespace dlasync::detail
