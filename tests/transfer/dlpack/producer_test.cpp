#include "dlasync/producer.hpp"

#include <atomic>
#include <vector>

#include "catch2/catch.hpp"
#include "dlasync/import.hpp"
#include "dlasync/tensor.hpp"
#include "support/registries.hpp"

namespace dlasync {

TEST_CASE("a produced tensor describes the caller's memory and releases it once",
          "[transfer][producer]") {
  std::vector<float> data(12, 1.0f);
  std::atomic<int> released{0};
  {
    managed_tensor t = make_managed_tensor({.data = data.data(),
                                            .device = {device_kind::cpu, 1},
                                            .dtype = dtypes::float64,
                                            .shape = {3, 2},
                                            .strides = std::vector<std::int64_t>{1, 3},
                                            .byte_offset = 8,
                                            .flags = flag_read_only},
                                           [&released] { ++released; });
    REQUIRE(t.is_versioned());
    CHECK(t.version().major == dlpack_major_version);
    CHECK(t.version().minor == dlpack_minor_version);
    CHECK(t.flags() == flag_read_only);
    const DLTensor& dl = *t.dl_tensor();
    CHECK(dl.data == data.data());
    CHECK(device_from_dl(dl.device) == device{device_kind::cpu, 1});
    CHECK(dtype::from_dl(dl.dtype) == dtypes::float64);
    REQUIRE(dl.ndim == 2);
    CHECK(dl.shape[0] == 3);
    CHECK(dl.shape[1] == 2);
    REQUIRE(dl.strides != nullptr);
    CHECK(dl.strides[0] == 1);
    CHECK(dl.strides[1] == 3);
    CHECK(dl.byte_offset == 8);
    CHECK(released == 0);
  }
  CHECK(released == 1);
}

TEST_CASE("a produced tensor without strides is compact, legacy ones have no version",
          "[transfer][producer]") {
  std::vector<std::int32_t> data(8, 5);
  std::atomic<int> released{0};
  managed_tensor legacy = make_managed_tensor(
      {.data = data.data(), .dtype = dtypes::int32, .shape = {2, 4}}, [&] { ++released; },
      dlpack_abi::legacy);
  REQUIRE_FALSE(legacy.is_versioned());
  CHECK(legacy.dl_tensor()->strides == nullptr);
  CHECK(legacy.flags() == 0);
  absl::StatusOr<import_plan> plan = plan_import(legacy, {}, testing::host_registry());
  REQUIRE(plan.ok());
  CHECK(plan->compact);
  CHECK(plan->byte_size == 32);
  absl::StatusOr<tensor> view = import_view(legacy, {}, testing::host_registry());
  REQUIRE(view.ok());
  CHECK(legacy.empty());
  CHECK(released == 0);
  view = absl::UnknownError("dropped");
  CHECK(released == 1);
}

TEST_CASE("a produced tensor given back with release() keeps its memory", "[transfer][producer]") {
  std::atomic<int> released{0};
  float x = 2.0f;
  managed_tensor t = make_managed_tensor({.data = &x, .shape = {}}, [&] { ++released; });
  released_tensor back = t.release();
  REQUIRE(back.versioned != nullptr);
  CHECK(released == 0);
  managed_tensor again(back);  // the producer takes it again, and frees it
  again.reset();
  CHECK(released == 1);
}

}  // namespace dlasync
