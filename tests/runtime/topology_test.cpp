#include "dlasync/device_registry.hpp"

#include <map>
#include <string>

#include "catch2/catch.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using testing::require_status;

struct fake_env {
  std::map<std::string, std::string> vars;
  process_topology::env_lookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

absl::StatusOr<process_topology> read(std::map<std::string, std::string> vars) {
  fake_env env{std::move(vars)};
  return process_topology::from_environment(env.lookup());
}

}  // namespace

TEST_CASE("no launcher variables give one process with one host device", "[runtime][topology]") {
  absl::StatusOr<process_topology> t = read({});
  REQUIRE(t.ok());
  CHECK(t->rank == 0);
  CHECK(t->world_size == 1);
  CHECK(t->local_world_size == 1);
  CHECK(t->host_device_count == 1);
  CHECK_FALSE(t->cuda_devices_per_node.has_value());
  CHECK(t->source == "default");
}

TEST_CASE("torchrun variables set the topology", "[runtime][topology]") {
  absl::StatusOr<process_topology> t =
      read({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  REQUIRE(t.ok());
  CHECK(t->rank == 5);
  CHECK(t->world_size == 8);
  CHECK(t->local_rank == 1);
  CHECK(t->local_world_size == 4);
  CHECK(t->source == "torchrun");
  CHECK(t->describe() == "rank 5 of 8 (local rank 1 of 4, from torchrun)");
}

TEST_CASE("Open MPI variables set the topology", "[runtime][topology]") {
  absl::StatusOr<process_topology> t = read({{"OMPI_COMM_WORLD_RANK", "3"},
                                             {"OMPI_COMM_WORLD_SIZE", "4"},
                                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  REQUIRE(t.ok());
  CHECK(t->rank == 3);
  CHECK(t->local_rank == 1);
  CHECK(t->local_world_size == 2);
  CHECK(t->source == "Open MPI");
}

TEST_CASE("Slurm's compressed task list gives the local world size", "[runtime][topology]") {
  absl::StatusOr<process_topology> t = read({{"SLURM_PROCID", "7"},
                                             {"SLURM_NTASKS", "7"},
                                             {"SLURM_LOCALID", "0"},
                                             {"SLURM_NODEID", "3"},
                                             {"SLURM_TASKS_PER_NODE", "2(x3),1"}});
  REQUIRE_FALSE(t.ok());  // rank 7 of 7 is outside the world
  require_status(t.status(), absl::StatusCode::kInvalidArgument, {"rank 7", "Slurm"});

  t = read({{"SLURM_PROCID", "6"},
            {"SLURM_NTASKS", "7"},
            {"SLURM_LOCALID", "0"},
            {"SLURM_NODEID", "3"},
            {"SLURM_TASKS_PER_NODE", "2(x3),1"}});
  REQUIRE(t.ok());
  CHECK(t->local_world_size == 1);
  t = read({{"SLURM_PROCID", "3"},
            {"SLURM_NTASKS", "7"},
            {"SLURM_LOCALID", "1"},
            {"SLURM_NODEID", "1"},
            {"SLURM_TASKS_PER_NODE", "2(x3),1"}});
  REQUIRE(t.ok());
  CHECK(t->local_world_size == 2);
  CHECK(t->source == "Slurm");
}

TEST_CASE("a malformed Slurm task list is refused naming the variable", "[runtime][topology]") {
  absl::StatusOr<process_topology> t =
      read({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "2(y3"}});
  require_status(t.status(), absl::StatusCode::kInvalidArgument,
                 {"SLURM_TASKS_PER_NODE", "2(y3", "Slurm task list"});
}

TEST_CASE("torchrun wins over Slurm when both are set", "[runtime][topology]") {
  absl::StatusOr<process_topology> t =
      read({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  REQUIRE(t.ok());
  CHECK(t->rank == 1);
  CHECK(t->local_world_size == 2);  // no LOCAL_*: one node
  CHECK(t->source == "torchrun");
}

TEST_CASE("DLASYNC_* variables override the launcher's", "[runtime][topology]") {
  absl::StatusOr<process_topology> t = read({{"RANK", "0"},
                                             {"WORLD_SIZE", "2"},
                                             {"DLASYNC_RANK", "1"},
                                             {"DLASYNC_HOST_DEVICES", "3"},
                                             {"DLASYNC_CUDA_DEVICES_PER_NODE", "4"},
                                             {"DLASYNC_CUDA_DEVICES", "1,3"}});
  REQUIRE(t.ok());
  CHECK(t->rank == 1);
  CHECK(t->host_device_count == 3);
  CHECK(t->cuda_devices_per_node == 4);
  CHECK(t->cuda_ordinals == std::vector<int>{1, 3});
  CHECK(t->source == "torchrun + DLASYNC_*");
}

TEST_CASE("malformed variables are refused naming the variable and value", "[runtime][topology]") {
  require_status(read({{"RANK", "two"}, {"WORLD_SIZE", "4"}}).status(),
                 absl::StatusCode::kInvalidArgument, {"RANK=\"two\"", "integer"});
  require_status(read({{"RANK", "1"}, {"WORLD_SIZE", "0"}}).status(),
                 absl::StatusCode::kInvalidArgument, {"WORLD_SIZE=\"0\"", "[1, "});
  require_status(read({{"DLASYNC_HOST_DEVICES", "99999"}}).status(),
                 absl::StatusCode::kInvalidArgument, {"DLASYNC_HOST_DEVICES", "1024"});
  require_status(read({{"DLASYNC_CUDA_DEVICES", "0,x"}}).status(),
                 absl::StatusCode::kInvalidArgument, {"DLASYNC_CUDA_DEVICES", "\"0,2\""});
  require_status(
      read({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})
          .status(),
      absl::StatusCode::kInvalidArgument, {"local rank 2", "[0, 2)"});
}

TEST_CASE("inconsistent topologies set in code are refused", "[runtime][topology]") {
  process_topology t;
  t.rank = 2;
  t.world_size = 2;
  require_status(t.check(), absl::StatusCode::kInvalidArgument, {"rank 2", "[0, 2)"});
  t = process_topology{};
  t.host_device_count = 0;
  require_status(t.check(), absl::StatusCode::kInvalidArgument, {"host device count 0"});
  t = process_topology{};
  t.cuda_devices_per_node = 2;
  t.cuda_ordinals = std::vector<int>{2};
  require_status(t.check(), absl::StatusCode::kInvalidArgument, {"CUDA ordinal 2"});
}

TEST_CASE("local ranks share a node's CUDA devices round robin", "[runtime][topology]") {
  process_topology t;
  t.rank = 5;
  t.world_size = 8;
  t.local_rank = 1;
  t.local_world_size = 4;
  CHECK(t.owns_cuda_ordinal(1));
  CHECK(t.owns_cuda_ordinal(5));
  CHECK_FALSE(t.owns_cuda_ordinal(0));
  CHECK(t.cuda_owner_rank(0) == 4);
  CHECK(t.cuda_owner_rank(3) == 7);
  CHECK(t.cuda_owner_rank(5) == 5);

  t.cuda_ordinals = std::vector<int>{0};
  CHECK(t.owns_cuda_ordinal(0));
  CHECK_FALSE(t.owns_cuda_ordinal(1));
  CHECK_FALSE(t.cuda_owner_rank(1).has_value());
}

}  // namespace dlasync
