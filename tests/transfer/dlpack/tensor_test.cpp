#include "dlasync/tensor.hpp"
#include "dlasync/import.hpp"

#include <cstring>
#include <numeric>
#include <vector>

#include "catch2/catch.hpp"
#include "support/registries.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using testing::deleter_count;
using testing::host_registry;
using testing::make_tensor;
using testing::require_status;
using testing::tensor_spec;

tensor import_ok(managed_tensor& t) {
  absl::StatusOr<tensor> view = import_view(t, {}, host_registry());
  REQUIRE(view.ok());
  return *std::move(view);
}

// The value at multi-index `index` read through `t`'s strides.
template <typename T>
T element_at(const tensor& t, const std::vector<std::int64_t>& index) {
  std::int64_t offset = 0;
  for (std::size_t d = 0; d < index.size(); ++d) offset += index[d] * t.strides()[d];
  T value;
  std::memcpy(&value, static_cast<const char*>(t.data()) + offset * sizeof(T), sizeof(T));
  return value;
}

}  // namespace

TEST_CASE("a view describes the producer's tensor", "[transfer][tensor]") {
  std::vector<double> data(24);
  std::iota(data.begin(), data.end(), 0.0);
  deleter_count count;
  tensor_spec s;
  s.type = dtypes::float64;
  s.shape = {2, 3, 3};
  s.data = data.data();
  s.byte_offset = 6 * sizeof(double);
  {
    managed_tensor source = make_tensor(s, count);
    tensor t = import_ok(source);
    CHECK(t.device() == host_device);
    CHECK(t.dtype() == dtypes::float64);
    CHECK(t.ndim() == 3);
    CHECK(std::vector<std::int64_t>(t.shape().begin(), t.shape().end()) ==
          std::vector<std::int64_t>{2, 3, 3});
    CHECK(std::vector<std::int64_t>(t.strides().begin(), t.strides().end()) ==
          std::vector<std::int64_t>{9, 3, 1});
    CHECK(t.element_count() == 18);
    CHECK(t.byte_size() == 144);
    CHECK(t.dl_data() == data.data());
    CHECK(t.byte_offset() == 48);
    CHECK(t.data() == data.data() + 6);
    CHECK(t.is_view());
    CHECK_FALSE(t.is_copy());
    CHECK(t.is_compact());
    CHECK_FALSE(t.read_only());
    CHECK(element_at<double>(t, {1, 2, 0}) == 6.0 + 9 + 6);
    CHECK(count.calls == 0);
  }
  CHECK(count.calls == 1);
}

TEST_CASE("copies of a tensor share one reference to the producer", "[transfer][tensor]") {
  float data[4] = {1, 2, 3, 4};
  deleter_count count;
  tensor_spec s;
  s.shape = {4};
  s.data = data;
  managed_tensor source = make_tensor(s, count);
  tensor a = import_ok(source);
  {
    tensor b = a;
    CHECK(a.use_count() == 2);
    a = tensor();
    CHECK(a.empty());
    CHECK(count.calls == 0);
  }
  CHECK(count.calls == 1);
}

TEST_CASE("READ_ONLY, zero and negative strides give read-only tensors", "[transfer][tensor]") {
  float data[16] = {};
  tensor_spec s;
  s.shape = {4, 4};
  s.data = data;
  s.flags = flag_read_only;
  deleter_count count;
  {
    managed_tensor a = make_tensor(s, count);
    CHECK(import_ok(a).read_only());

    s.flags = 0;
    s.strides = std::vector<std::int64_t>{0, 1};
    managed_tensor b = make_tensor(s, count);
    tensor broadcast = import_ok(b);
    CHECK(broadcast.read_only());
    CHECK((broadcast.flags() & flag_read_only) != 0);

    s.strides = std::vector<std::int64_t>{4, -1};
    s.byte_offset = 3 * sizeof(float);
    managed_tensor c = make_tensor(s, count);
    tensor reversed = import_ok(c);
    CHECK(reversed.read_only());
    CHECK_FALSE(reversed.is_compact());

    // Extents of 1 may carry any stride without making a tensor read-only.
    s.shape = {1, 16};
    s.strides = std::vector<std::int64_t>{0, 1};
    s.byte_offset = 0;
    managed_tensor d = make_tensor(s, count);
    tensor row = import_ok(d);
    CHECK_FALSE(row.read_only());
    CHECK(row.is_compact());
  }
  CHECK(count.calls == 4);
}

TEST_CASE("a tensor round-trips through versioned and legacy exports", "[transfer][tensor]") {
  std::vector<std::int32_t> data(40);
  std::iota(data.begin(), data.end(), 100);
  deleter_count count;
  tensor_spec s;
  s.type = dtypes::int32;
  s.shape = {3, 4};
  s.strides = std::vector<std::int64_t>{8, 2};  // every other column of a 5x8 slab
  s.data = data.data();
  s.byte_offset = 8 * sizeof(std::int32_t);
  s.flags = flag_is_copied;
  {
    managed_tensor source = make_tensor(s, count);
    tensor first = import_ok(source);

    absl::StatusOr<DLManagedTensorVersioned*> versioned = first.to_dlpack_versioned();
    REQUIRE(versioned.ok());
    CHECK((*versioned)->version.major == 1);
    managed_tensor hop1(*versioned);
    tensor second = import_ok(hop1);

    absl::StatusOr<DLManagedTensor*> legacy = second.to_dlpack_legacy();
    REQUIRE(legacy.ok());
    managed_tensor hop2(*legacy);
    tensor third = import_ok(hop2);

    for (const tensor* t : {&second, &third}) {
      CHECK(t->dl_data() == data.data());
      CHECK(t->byte_offset() == first.byte_offset());
      CHECK(std::vector<std::int64_t>(t->shape().begin(), t->shape().end()) ==
            std::vector<std::int64_t>{3, 4});
      CHECK(std::vector<std::int64_t>(t->strides().begin(), t->strides().end()) ==
            std::vector<std::int64_t>{8, 2});
      CHECK(t->dtype() == dtypes::int32);
      for (std::int64_t i = 0; i < 3; ++i) {
        for (std::int64_t j = 0; j < 4; ++j) {
          CHECK(element_at<std::int32_t>(*t, {i, j}) == 100 + 8 + 8 * i + 2 * j);
        }
      }
    }
    CHECK(second.flags() == flag_is_copied);
    CHECK(third.flags() == 0);  // legacy DLPack carries no flags
    first = tensor();
    second = tensor();
    CHECK(count.calls == 0);  // `third` still reaches the producer's memory
  }
  CHECK(count.calls == 1);
}

TEST_CASE("flags survive a versioned round trip", "[transfer][tensor]") {
  std::uint8_t data[8] = {};
  deleter_count count;
  tensor_spec s;
  s.type = dtypes::bool8;
  s.shape = {8};
  s.data = data;
  s.flags = flag_read_only | flag_is_copied;
  {
    managed_tensor source = make_tensor(s, count);
    tensor first = import_ok(source);
    managed_tensor hop(*first.to_dlpack_versioned());
    CHECK(hop.flags() == (flag_read_only | flag_is_copied));
    tensor second = import_ok(hop);
    CHECK(second.flags() == (flag_read_only | flag_is_copied));
    CHECK(second.read_only());
  }
  CHECK(count.calls == 1);
}

TEST_CASE("a read-only tensor is not exported as legacy DLPack", "[transfer][tensor]") {
  float data[4] = {};
  deleter_count count;
  tensor_spec s;
  s.shape = {4};
  s.data = data;
  s.flags = flag_read_only;
  managed_tensor source = make_tensor(s, count);
  tensor t = import_ok(source);
  require_status(t.to_dlpack_legacy().status(), absl::StatusCode::kFailedPrecondition,
                 {"read-only", "legacy", "to_dlpack_versioned"});
  require_status(tensor().to_dlpack_versioned().status(), absl::StatusCode::kFailedPrecondition,
                 {"empty"});
}

TEST_CASE("an export outlives the tensor and releases the producer last", "[transfer][tensor]") {
  float data[4] = {};
  deleter_count count;
  tensor_spec s;
  s.shape = {2, 2};
  s.data = data;
  managed_tensor source = make_tensor(s, count);
  DLManagedTensor* exported = nullptr;
  {
    tensor t = import_ok(source);
    exported = *t.to_dlpack_legacy();
  }
  CHECK(count.calls == 0);
  // A consumer scribbling on the exported shape does not reach our state.
  exported->dl_tensor.shape[0] = 99;
  exported->deleter(exported);
  CHECK(count.calls == 1);
}

TEST_CASE("every supported dtype imports as a view that keeps it", "[transfer][tensor]") {
  alignas(16) std::uint8_t data[64] = {};
  for (std::uint8_t code = 0; code <= 17; ++code) {
    if (code == 3) continue;  // opaque handles are refused
    const std::uint8_t bits = code == 0 || code == 1 || code == 2 ? 32
                              : code == 4                         ? 16
                              : code == 5                         ? 128
                              : code == 15 || code == 16          ? 6
                              : code == 17                        ? 4
                                                                  : 8;
    deleter_count count;
    tensor_spec s;
    s.type = dtype{code, bits, 1};
    s.shape = {2, 2};
    s.data = data;
    {
      managed_tensor source = make_tensor(s, count);
      tensor t = import_ok(source);
      INFO(s.type.name());
      CHECK(t.dtype() == s.type);
      CHECK(t.byte_size() == (4u * bits + 7) / 8);
    }
    CHECK(count.calls == 1);
  }
}

}  // namespace dlasync
