// Two processes of one node, their topology set through torchrun's
// variables: each refuses a tensor on the other's GPU, naming the owner.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "support/test_tensors.hpp"

extern char** environ;

namespace dlasync {
namespace {

struct child_result {
  int status = -1;
  std::string output;
};

// Runs the child with the launcher variables of rank `rank` of 2.
child_result run_child(int rank, int foreign_ordinal) {
  std::vector<std::string> env = {"RANK=" + std::to_string(rank), "WORLD_SIZE=2",
                                  "LOCAL_RANK=" + std::to_string(rank), "LOCAL_WORLD_SIZE=2",
                                  "DLASYNC_CUDA_DEVICES_PER_NODE=2"};
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string path = DLASYNC_LOCALITY_CHILD;
  std::string ordinal = std::to_string(foreign_ordinal);
  char* argv[] = {path.data(), ordinal.data(), nullptr};

  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, path.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  child_result r;
  if (spawned != 0) {
    close(pipe_fds[0]);
    return r;
  }
  std::array<char, 512> buf;
  ssize_t n = 0;
  while ((n = read(pipe_fds[0], buf.data(), buf.size())) > 0) r.output.append(buf.data(), n);
  close(pipe_fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  return r;
}

}  // namespace

TEST_CASE("two processes each refuse the other's GPU, naming its owner", "[transfer][locality]") {
  // This process is rank 0 of 2, from the same variables.
  const std::vector<std::pair<std::string, std::string>> vars = {
      {"RANK", "0"},
      {"WORLD_SIZE", "2"},
      {"LOCAL_RANK", "0"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"DLASYNC_CUDA_DEVICES_PER_NODE", "2"}};
  absl::StatusOr<process_topology> topology =
      process_topology::from_environment([&](const char* name) -> const char* {
        for (const auto& [k, v] : vars) {
          if (k == name) return v.c_str();
        }
        return nullptr;
      });
  REQUIRE(topology.ok());
  runtime_options o;
  o.topology = *topology;
  o.worker_threads = 1;
  std::unique_ptr<runtime> rt = *runtime::create(o);

  float data[4] = {};
  testing::tensor_spec s;
  s.shape = {4};
  s.data = data;
  s.device = {device_kind::cuda, 1};
  testing::deleter_count count;
  managed_tensor source = testing::make_tensor(s, count);
  absl::StatusOr<tensor> t = async_import_dlpack(*rt, source, {}, asio::use_future).get();
  testing::require_status(
      t.status(), absl::StatusCode::kFailedPrecondition,
      {"cuda:1", "rank 0 of 2", "from torchrun", "process rank 1", "Import the tensor on rank 1"});
  CHECK_FALSE(source.empty());
  CHECK(count.calls == 0);

  const child_result child = run_child(1, 0);
  INFO("child said: " << child.output);
  CHECK(child.status == 0);
  CHECK(child.output.find("rank 1 of 2") != std::string::npos);
  CHECK(child.output.find("cuda:0") != std::string::npos);
  CHECK(child.output.find("process rank 0") != std::string::npos);
}

}  // namespace dlasync
