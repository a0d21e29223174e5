#include "dlasync/device.hpp"

#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "catch2/catch.hpp"

namespace dlasync {

TEST_CASE("devices are named kind:ordinal", "[runtime][device]") {
  CHECK(device{device_kind::cpu, 0}.name() == "cpu:0");
  CHECK(device{device_kind::cuda, 3}.name() == "cuda:3");
  CHECK(device{device_kind::cuda_host, 0}.name() == "cuda_host:0");
  CHECK(device{device_kind::tpu_host, 1}.name() == "tpu_host:1");
  std::ostringstream os;
  os << device{device_kind::rocm, 2};
  CHECK(os.str() == "rocm:2");
}

TEST_CASE("unknown device type codes are named by their number", "[runtime][device]") {
  CHECK(device{static_cast<device_kind>(42), 0}.name() == "device_type_42:0");
  CHECK(device{static_cast<device_kind>(5), 1}.name() == "device_type_5:1");
  CHECK_FALSE(is_known_device_kind(0));
  CHECK_FALSE(is_known_device_kind(5));
  CHECK_FALSE(is_known_device_kind(6));
  CHECK_FALSE(is_known_device_kind(21));
  for (int code : {1, 2, 3, 4, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}) {
    CHECK(is_known_device_kind(code));
    CHECK(std::string(device_kind_name(static_cast<device_kind>(code))) != "unknown");
  }
}

TEST_CASE("devices compare and hash as values", "[runtime][device]") {
  absl::flat_hash_set<device> set{
      {device_kind::cpu, 0}, {device_kind::cuda, 0}, {device_kind::cuda, 1}, {device_kind::cpu, 0}};
  CHECK(set.size() == 3);
  CHECK(device{device_kind::cuda, 1} != device{device_kind::cuda, 0});
  CHECK(host_device == device{device_kind::cpu, 0});
}

TEST_CASE("host memory kinds are the ones the CPU reads directly", "[runtime][device]") {
  CHECK(is_host_memory(device_kind::cpu));
  CHECK(is_host_memory(device_kind::cuda_host));
  CHECK(is_host_memory(device_kind::rocm_host));
  CHECK_FALSE(is_host_memory(device_kind::cuda));
  CHECK_FALSE(is_host_memory(device_kind::cuda_managed));
}

}  // namespace dlasync
