#include "dlasync/import.hpp"

#include <cstdint>
#include <limits>

#include "catch2/catch.hpp"
#include "dlasync/tensor.hpp"
#include "runtime/src/device_registry_factory.hpp"
#include "support/registries.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::host_registry;
using testing::make_tensor;
using testing::require_status;
using testing::tensor_spec;

alignas(64) float storage[64];

tensor_spec matrix() {
  tensor_spec s;
  s.shape = {4, 8};
  s.data = storage;
  return s;
}

// Refuses `spec` with `code` and `words`, proves the tensor was not consumed,
// and lets the handle delete it exactly once.
void require_refused(const tensor_spec& spec, const import_options& options,
                     const device_registry& registry, absl::StatusCode code,
                     std::initializer_list<const char*> words) {
  deleter_count count;
  {
    managed_tensor t = make_tensor(spec, count);
    const void* raw = t.is_versioned() ? static_cast<const void*>(t.versioned())
                                       : static_cast<const void*>(t.legacy());
    require_status(validate_dlpack(t, options, registry), code, words);
    absl::StatusOr<tensor> view = import_view(t, options, registry);
    require_status(view.status(), code, words);
    CHECK(count.calls == 0);
    CHECK_FALSE(t.empty());
    const void* still = t.is_versioned() ? static_cast<const void*>(t.versioned())
                                         : static_cast<const void*>(t.legacy());
    CHECK(still == raw);
  }
  CHECK(count.calls == 1);
}

void require_refused(const tensor_spec& spec, absl::StatusCode code,
                     std::initializer_list<const char*> words) {
  require_refused(spec, {}, host_registry(), code, words);
}

}  // namespace

TEST_CASE("a compact host tensor is accepted and planned as a view", "[transfer][validate]") {
  for (bool versioned : {false, true}) {
    deleter_count count;
    tensor_spec s = matrix();
    s.versioned = versioned;
    managed_tensor t = make_tensor(s, count);
    absl::StatusOr<import_plan> plan = plan_import(t, {}, host_registry());
    REQUIRE(plan.ok());
    CHECK(plan->source == host_device);
    CHECK(plan->target == host_device);
    CHECK(plan->element_count == 32);
    CHECK(plan->byte_size == 128);
    CHECK(plan->span_begin == 0);
    CHECK(plan->span_end == 128);
    CHECK(plan->compact);
    CHECK_FALSE(plan->read_only);
    CHECK_FALSE(plan->needs_copy());
    CHECK(plan->alignment == 4);
    CHECK(plan->versioned == versioned);
    CHECK(count.calls == 0);
  }
}

TEST_CASE("an empty handle is refused as NULL", "[transfer][validate]") {
  managed_tensor empty;
  require_status(validate_dlpack(empty, {}, host_registry()), absl::StatusCode::kInvalidArgument,
                 {"NULL", "consumed at most once"});
}

TEST_CASE("a newer major version is refused without reading the tensor", "[transfer][validate]") {
  tensor_spec s = matrix();
  s.version = {2, 1};
  s.ndim = 1 << 30;     // would be refused as too many dimensions if read
  s.null_shape = true;  // and would crash if dereferenced
  require_refused(s, absl::StatusCode::kUnimplemented,
                  {"major version 2.1", "1.x", "max_version (1, 3)"});
}

TEST_CASE("newer minor versions of 1.x are accepted", "[transfer][validate]") {
  deleter_count count;
  tensor_spec s = matrix();
  s.version = {1, 99};
  managed_tensor t = make_tensor(s, count);
  CHECK(validate_dlpack(t, {}, host_registry()).ok());
}

TEST_CASE("a versioned tensor claiming version 0 is refused", "[transfer][validate]") {
  tensor_spec s = matrix();
  s.version = {0, 8};
  require_refused(s, absl::StatusCode::kInvalidArgument, {"version 0.8", "start at 1.0"});
}

TEST_CASE("ndim must be between 0 and the limit", "[transfer][validate]") {
  tensor_spec s = matrix();
  s.ndim = -1;
  require_refused(s, absl::StatusCode::kInvalidArgument, {"ndim -1", "negative"});
  s.ndim = 65;
  s.null_shape = true;
  require_refused(s, absl::StatusCode::kOutOfRange, {"ndim 65", "limit of 64"});
}

TEST_CASE("a NULL shape with dimensions is refused", "[transfer][validate]") {
  tensor_spec s = matrix();
  s.null_shape = true;
  require_refused(s, absl::StatusCode::kInvalidArgument, {"shape is NULL", "ndim is 2"});
}

TEST_CASE("negative extents are refused naming the dimension", "[transfer][validate]") {
  tensor_spec s = matrix();
  s.shape = {4, -3};
  require_refused(s, absl::StatusCode::kInvalidArgument, {"shape[1] is -3"});
}

TEST_CASE("element counts and byte sizes that overflow are refused", "[transfer][validate]") {
  tensor_spec s = matrix();
  s.shape = {std::int64_t{1} << 32, std::int64_t{1} << 32};
  require_refused(s, absl::StatusCode::kOutOfRange,
                  {"element count", "[4294967296, 4294967296]", "overflows"});
  s.shape = {std::int64_t{1} << 62};
  s.type = dtypes::float64;
  require_refused(s, absl::StatusCode::kOutOfRange, {"byte size", "float64", "overflows"});
}

TEST_CASE("a zero extent makes any shape size 0", "[transfer][validate]") {
  deleter_count count;
  tensor_spec s = matrix();
  s.shape = {std::int64_t{1} << 40, std::int64_t{1} << 40, 0};
  s.data = nullptr;
  managed_tensor t = make_tensor(s, count);
  absl::StatusOr<import_plan> plan = plan_import(t, {}, host_registry());
  REQUIRE(plan.ok());
  CHECK(plan->element_count == 0);
  CHECK(plan->byte_size == 0);
}

TEST_CASE("NULL data is refused unless the tensor is empty", "[transfer][validate]") {
  tensor_spec s = matrix();
  s.data = nullptr;
  require_refused(s, absl::StatusCode::kInvalidArgument, {"data is NULL", "32 elements"});
  s.shape = {0, 8};
  deleter_count count;
  managed_tensor t = make_tensor(s, count);
  CHECK(validate_dlpack(t, {}, host_registry()).ok());
}

TEST_CASE("strides whose span overflows are refused", "[transfer][validate]") {
  tensor_spec s = matrix();
  s.shape = {4};
  s.strides = std::vector<std::int64_t>{std::int64_t{1} << 62};
  require_refused(s, absl::StatusCode::kOutOfRange, {"memory span", "overflows"});
  s.strides = std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min()};
  require_refused(s, absl::StatusCode::kOutOfRange, {"memory span", "overflows"});
  // Each end fits in 64 bits (-2^62 and 2^63 - 4 bytes), the width between
  // them does not (found by the descriptor fuzzer, through a remote plan).
  s.shape = {2, 2};
  s.strides = std::vector<std::int64_t>{-(std::int64_t{1} << 60), (std::int64_t{1} << 61) - 2};
  require_refused(s, absl::StatusCode::kOutOfRange, {"memory span", "overflows 64 bits"});
}

TEST_CASE("a span leaving the address space is refused", "[transfer][validate]") {
  tensor_spec s = matrix();
  // NOLINTNEXTLINE(performance-no-int-to-ptr): an address validation checks, never read
  s.data = reinterpret_cast<void*>(std::uintptr_t{64});
  s.shape = {100};
  s.strides = std::vector<std::int64_t>{-1};  // reaches 396 bytes below address 64
  require_refused(s, absl::StatusCode::kOutOfRange, {"address space", "byte_offset 0"});

  s = matrix();
  s.byte_offset = std::numeric_limits<std::uint64_t>::max() - 16;
  require_refused(s, absl::StatusCode::kOutOfRange, {"address space", "byte offset"});
}

TEST_CASE("dtype rules apply to imports", "[transfer][validate]") {
  tensor_spec s = matrix();
  s.type = dtype{2, 24, 1};
  require_refused(s, absl::StatusCode::kInvalidArgument, {"24 bits", "float"});
  s.type = dtype{2, 32, 2};
  require_refused(s, absl::StatusCode::kUnimplemented, {"2 lanes"});
  s.type = dtypes::float4_e2m1fn;
  s.flags = flag_subbyte_padded;
  require_refused(s, absl::StatusCode::kUnimplemented, {"IS_SUBBYTE_TYPE_PADDED"});
}

TEST_CASE("packed sub-byte tensors are imported only when compact", "[transfer][validate]") {
  deleter_count count;
  tensor_spec s = matrix();
  s.shape = {3, 3};
  s.type = dtypes::float4_e2m1fn;
  managed_tensor t = make_tensor(s, count);
  absl::StatusOr<import_plan> plan = plan_import(t, {}, host_registry());
  REQUIRE(plan.ok());
  CHECK(plan->byte_size == 5);  // 9 elements of 4 bits
  CHECK(plan->span_end == 5);
  CHECK(plan->alignment == 1);

  s.strides = std::vector<std::int64_t>{1, 3};
  require_refused(s, absl::StatusCode::kUnimplemented, {"strided float4_e2m1fn", "contiguous"});
}

TEST_CASE("device types no backend serves are refused listing what is", "[transfer][validate]") {
  tensor_spec s = matrix();
  s.device = {device_kind::vulkan, 0};
  require_refused(s, absl::StatusCode::kUnimplemented,
                  {"source device vulkan:0", "not served", "serves cpu"});
  s.device = {device_kind::cuda, 0};
  require_refused(s, absl::StatusCode::kUnimplemented, {"cuda:0", "CUDA"});
  s.device = {device_kind::metal, 0};
  require_refused(s, absl::StatusCode::kUnimplemented, {"metal:0"});
  s.device = {static_cast<device_kind>(99), 0};
  require_refused(s, absl::StatusCode::kInvalidArgument, {"device type 99"});
}

TEST_CASE("the target is checked like the source", "[transfer][validate]") {
  import_options o;
  o.target = device{device_kind::rocm, 0};
  require_refused(matrix(), o, host_registry(), absl::StatusCode::kUnimplemented,
                  {"target device rocm:0", "not served"});
  o.target = device{device_kind::cpu, 7};
  require_refused(matrix(), o, host_registry(), absl::StatusCode::kNotFound,
                  {"target device cpu:7", "addresses cpu:0, cpu:1"});
}

TEST_CASE("devices of another process are refused naming the owner", "[transfer][validate]") {
  process_topology t;
  t.rank = 1;
  t.world_size = 2;
  t.local_rank = 1;
  t.local_world_size = 2;
  t.cuda_devices_per_node = 2;
  const device_registry registry = *detail::device_registry_factory::host_only(t);
  tensor_spec s = matrix();
  s.device = {device_kind::cuda, 0};
  require_refused(s, {}, registry, absl::StatusCode::kFailedPrecondition,
                  {"cuda:0", "not addressable", "process rank 0", "Import the tensor on rank 0",
                   "have rank 0 publish it", "dlasync's remote import"});
  import_options o;
  o.target = device{device_kind::cuda, 0};
  require_refused(matrix(), o, registry, absl::StatusCode::kFailedPrecondition,
                  {"target device cuda:0", "rank 0", "addresses cpu:0"});
}

TEST_CASE("copy=false refuses each reason that forces a copy", "[transfer][validate]") {
  import_options o;
  o.copy = false;
  o.target = device{device_kind::cpu, 1};
  require_refused(matrix(), o, host_registry(), absl::StatusCode::kFailedPrecondition,
                  {"copy=false", "cross-device (cpu:0 to cpu:1)"});

  o = import_options{};
  o.copy = false;
  tensor_spec misaligned = matrix();
  misaligned.byte_offset = 2;  // float32 at an address of 2 mod 4
  require_refused(misaligned, o, host_registry(), absl::StatusCode::kFailedPrecondition,
                  {"copy=false", "alignment", "requires 4 bytes"});

  tensor_spec transposed = matrix();
  transposed.shape = {8, 4};
  transposed.strides = std::vector<std::int64_t>{1, 8};
  o.require_contiguous = true;
  require_refused(transposed, o, host_registry(), absl::StatusCode::kFailedPrecondition,
                  {"copy=false", "contiguity"});

  o = import_options{};
  o.copy = false;
  o.require_writable = true;
  tensor_spec read_only = matrix();
  read_only.flags = flag_read_only;
  require_refused(read_only, o, host_registry(), absl::StatusCode::kFailedPrecondition,
                  {"copy=false", "writability", "READ_ONLY"});
  tensor_spec broadcast = matrix();
  broadcast.strides = std::vector<std::int64_t>{0, 1};
  require_refused(broadcast, o, host_registry(), absl::StatusCode::kFailedPrecondition,
                  {"writability", "zero or negative strides"});
}

TEST_CASE("a refused tensor can still be imported afterwards", "[transfer][validate]") {
  deleter_count count;
  managed_tensor t = make_tensor(matrix(), count);
  import_options o;
  o.copy = false;
  o.target = device{device_kind::cpu, 1};
  CHECK(import_view(t, o, host_registry()).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  REQUIRE_FALSE(t.empty());
  {
    absl::StatusOr<tensor> view = import_view(t, {}, host_registry());
    REQUIRE(view.ok());
    CHECK(t.empty());
    CHECK(view->data() == storage);
    CHECK(count.calls == 0);
  }
  CHECK(count.calls == 1);
}

TEST_CASE("copy reasons are planned when copies are allowed", "[transfer][validate]") {
  deleter_count count;
  tensor_spec s = matrix();
  s.shape = {8, 4};
  s.strides = std::vector<std::int64_t>{1, 8};
  managed_tensor t = make_tensor(s, count);
  import_options o;
  o.target = device{device_kind::cpu, 1};
  o.require_contiguous = true;
  o.copy = true;
  absl::StatusOr<import_plan> plan = plan_import(t, o, host_registry());
  REQUIRE(plan.ok());
  CHECK(plan->has(copy_reason::requested));
  CHECK(plan->has(copy_reason::cross_device));
  CHECK(plan->has(copy_reason::contiguity));
  CHECK_FALSE(plan->has(copy_reason::alignment));
  CHECK_FALSE(plan->has(copy_reason::writable));
  CHECK_FALSE(plan->compact);
  CHECK(plan->copy_reason_text() ==
        "requested (copy=true), cross-device (cpu:0 to cpu:1), contiguity (strides are not "
        "row-major and require_contiguous is set)");
  CHECK(count.calls == 0);
}

TEST_CASE("copy=true is satisfied by a producer copy flagged IS_COPIED", "[transfer][validate]") {
  deleter_count count;
  tensor_spec s = matrix();
  s.flags = flag_is_copied;
  managed_tensor t = make_tensor(s, count);
  import_options o;
  o.copy = true;
  absl::StatusOr<import_plan> plan = plan_import(t, o, host_registry());
  REQUIRE(plan.ok());
  CHECK_FALSE(plan->needs_copy());
}

TEST_CASE("alignment is the element size or what the caller asks, never 256",
          "[transfer][validate]") {
  deleter_count count;
  tensor_spec s = matrix();
  s.byte_offset = 4;  // 4-byte aligned, not 8 or 256
  managed_tensor t = make_tensor(s, count);
  absl::StatusOr<import_plan> plan = plan_import(t, {}, host_registry());
  REQUIRE(plan.ok());
  CHECK_FALSE(plan->has(copy_reason::alignment));

  import_options o;
  o.min_alignment = 64;
  plan = plan_import(t, o, host_registry());
  REQUIRE(plan.ok());
  CHECK(plan->alignment == 64);
  CHECK(plan->has(copy_reason::alignment));

  o.min_alignment = 3;
  require_status(validate_dlpack(t, o, host_registry()), absl::StatusCode::kInvalidArgument,
                 {"min_alignment 3", "power of two"});
  CHECK(count.calls == 0);
}

TEST_CASE("a size-0 tensor skips stride and alignment checks", "[transfer][validate]") {
  deleter_count count;
  tensor_spec s = matrix();
  s.shape = {0, 3};
  s.strides = std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::max(), 1};
  // NOLINTNEXTLINE(performance-no-int-to-ptr): an address validation checks, never read
  s.data = reinterpret_cast<void*>(std::uintptr_t{3});
  managed_tensor t = make_tensor(s, count);
  absl::StatusOr<import_plan> plan = plan_import(t, {}, host_registry());
  REQUIRE(plan.ok());
  CHECK_FALSE(plan->needs_copy());
  CHECK(plan->span_end == 0);
}

TEST_CASE("host tensors take no stream but none", "[transfer][validate]") {
  import_options o;
  o.stream = 7;
  require_refused(matrix(), o, host_registry(), absl::StatusCode::kInvalidArgument,
                  {"stream 7", "cpu:0", "no streams"});
  o.stream = stream_no_sync;
  deleter_count count;
  managed_tensor t = make_tensor(matrix(), count);
  CHECK(validate_dlpack(t, o, host_registry()).ok());
}

TEST_CASE("pinned host memory is read as host memory", "[transfer][validate]") {
  deleter_count count;
  tensor_spec s = matrix();
  s.device = {device_kind::cuda_host, 0};
  managed_tensor t = make_tensor(s, count);
  absl::StatusOr<import_plan> plan = plan_import(t, {}, host_registry());
  REQUIRE(plan.ok());
  CHECK(plan->target == (device{device_kind::cuda_host, 0}));

  import_options o;
  o.target = host_device;
  plan = plan_import(t, o, host_registry());
  REQUIRE(plan.ok());
  CHECK_FALSE(plan->needs_copy());  // the same memory, no copy

  o.stream = 0;
  require_status(validate_dlpack(t, o, host_registry()), absl::StatusCode::kInvalidArgument,
                 {"stream 0", "not a DLPack stream value"});
  o.stream = 2;
  require_status(validate_dlpack(t, o, host_registry()), absl::StatusCode::kUnimplemented,
                 {"stream 2", "CUDA backend"});

  o = import_options{};
  o.copy = true;
  require_status(validate_dlpack(t, o, host_registry()), absl::StatusCode::kUnimplemented,
                 {"cannot place copies in cuda_host", "cpu:0"});
  CHECK(count.calls == 0);
}

}  // namespace dlasync
