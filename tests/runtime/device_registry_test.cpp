#include "dlasync/device_registry.hpp"

#include "catch2/catch.hpp"
#include "runtime/src/device_registry_factory.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using testing::require_status;

process_topology second_of_two(int cuda_per_node) {
  process_topology t;
  t.rank = 1;
  t.world_size = 2;
  t.local_rank = 1;
  t.local_world_size = 2;
  t.cuda_devices_per_node = cuda_per_node;
  t.source = "code";
  return t;
}

}  // namespace

TEST_CASE("the host backend serves its host devices and reads pinned memory",
          "[runtime][registry]") {
  absl::StatusOr<device_registry> r =
      detail::device_registry_factory::host_only(process_topology::single_process(2));
  REQUIRE(r.ok());
  CHECK(r->addressable_list() == "cpu:0, cpu:1, cuda_host:0");
  CHECK(r->served_list() == "cpu (host backend, 2 devices), cuda_host (host backend, 1 device)");
  CHECK(r->check_device({device_kind::cpu, 1}, "target").ok());
  CHECK(r->check_device({device_kind::cuda_host, 0}, "source").ok());
  REQUIRE(r->find(device_kind::cuda_host) != nullptr);
  CHECK_FALSE(r->find(device_kind::cuda_host)->allocates);
}

TEST_CASE("a device kind no backend serves is refused listing what is served",
          "[runtime][registry]") {
  absl::StatusOr<device_registry> r =
      detail::device_registry_factory::host_only(process_topology::single_process());
  REQUIRE(r.ok());
  require_status(r->check_device({device_kind::opencl, 0}, "source"),
                 absl::StatusCode::kUnimplemented,
                 {"source device opencl:0", "not served", "cpu (host backend, 1 device)"});
  require_status(r->check_device({device_kind::cuda, 0}, "target"),
                 absl::StatusCode::kUnimplemented, {"target device cuda:0", "CUDA", "serves cpu"});
}

TEST_CASE("unknown device types and negative ordinals are invalid", "[runtime][registry]") {
  absl::StatusOr<device_registry> r =
      detail::device_registry_factory::host_only(process_topology::single_process());
  REQUIRE(r.ok());
  require_status(r->check_device({static_cast<device_kind>(6), 0}, "source"),
                 absl::StatusCode::kInvalidArgument, {"device type 6", "not a DLPack device type"});
  require_status(r->check_device({device_kind::cpu, -1}, "source"),
                 absl::StatusCode::kInvalidArgument, {"cpu:-1", "negative"});
}

TEST_CASE("an ordinal beyond the served devices is not found", "[runtime][registry]") {
  absl::StatusOr<device_registry> r =
      detail::device_registry_factory::host_only(process_topology::single_process(2));
  REQUIRE(r.ok());
  require_status(r->check_device({device_kind::cpu, 2}, "target"), absl::StatusCode::kNotFound,
                 {"cpu:2", "2 devices", "addresses cpu:0, cpu:1"});
}

TEST_CASE("a CUDA device of another process is refused naming its owner", "[runtime][registry]") {
  absl::StatusOr<device_registry> r = detail::device_registry_factory::host_only(second_of_two(2));
  REQUIRE(r.ok());
  require_status(r->check_device({device_kind::cuda, 0}, "source"),
                 absl::StatusCode::kFailedPrecondition,
                 {"source device cuda:0", "not addressable", "rank 1 of 2", "process rank 0",
                  "Import the tensor on rank 0", "cpu:0"});
  // Its own GPU is addressable by topology, but this build serves no CUDA.
  require_status(r->check_device({device_kind::cuda, 1}, "source"),
                 absl::StatusCode::kUnimplemented, {"cuda:1", "not served"});
}

TEST_CASE("a CUDA backend's devices are split among the node's processes", "[runtime][registry]") {
  process_topology t = second_of_two(4);
  std::vector<served_devices> served = host_backend_devices(1);
  served.push_back({"cuda (simulated)", device_kind::cuda, 4, true});
  absl::StatusOr<device_registry> r = detail::device_registry_factory::create(t, served);
  REQUIRE(r.ok());
  CHECK(r->addressable_list() == "cpu:0, cuda:1, cuda:3, cuda_host:0");
  CHECK(r->check_device({device_kind::cuda, 3}, "target").ok());
  require_status(r->check_device({device_kind::cuda, 2}, "target"),
                 absl::StatusCode::kFailedPrecondition, {"cuda:2", "process rank 0"});
  require_status(r->check_device({device_kind::cuda, 4}, "target"), absl::StatusCode::kNotFound,
                 {"cuda:4", "4 devices"});
  // The other local process, rank 0, owns the even ordinals.
  require_status(r->check_device({device_kind::cuda, 0}, "source"),
                 absl::StatusCode::kFailedPrecondition, {"cuda:0", "process rank 0"});
  CHECK(r->check_device({device_kind::cuda, 1}, "source").ok());
}

TEST_CASE("managed memory of another process's GPU is refused like the GPU itself",
          "[runtime][registry][locality]") {
  // Rank 1 of 2 on a node of 4 GPUs owns cuda:1 and cuda:3. A managed
  // tensor of cuda:0 was once accepted there and became a view.
  process_topology t = second_of_two(4);
  std::vector<served_devices> served = host_backend_devices(1);
  served.push_back({"cuda (simulated)", device_kind::cuda, 4, true});
  served.push_back({"cuda (simulated)", device_kind::cuda_managed, 4, false});
  absl::StatusOr<device_registry> r = detail::device_registry_factory::create(t, served);
  REQUIRE(r.ok());
  require_status(r->check_device({device_kind::cuda_managed, 0}, "source"),
                 absl::StatusCode::kFailedPrecondition,
                 {"source device cuda_managed:0", "not addressable", "process rank 0",
                  "Import the tensor on rank 0"});
  CHECK(r->check_device({device_kind::cuda_managed, 1}, "source").ok());
  CHECK(r->addressable_list() ==
        "cpu:0, cuda:1, cuda:3, cuda_host:0, cuda_managed:1, cuda_managed:3");
  // Pinned host memory has one ordinal, 0, in every process.
  CHECK(r->check_device({device_kind::cuda_host, 0}, "source").ok());
  require_status(r->check_device({device_kind::cuda_host, 1}, "source"),
                 absl::StatusCode::kNotFound, {"cuda_host:1", "1 device"});
}

TEST_CASE("a registry refuses contradicting backends", "[runtime][registry]") {
  std::vector<served_devices> served = host_backend_devices(1);
  served.push_back({"other", device_kind::cpu, 1, true});
  require_status(detail::device_registry_factory::create(process_topology{}, served).status(),
                 absl::StatusCode::kInvalidArgument, {"cpu", "both backend host", "other"});
  require_status(detail::device_registry_factory::create(process_topology{},
                                                         {{"host", device_kind::cpu, -1, true}})
                     .status(),
                 absl::StatusCode::kInvalidArgument, {"-1"});
  process_topology bad;
  bad.world_size = 0;
  require_status(detail::device_registry_factory::host_only(bad).status(),
                 absl::StatusCode::kInvalidArgument, {"world size 0"});
}

}  // namespace dlasync
