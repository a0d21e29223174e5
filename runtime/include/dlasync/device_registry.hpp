// dlasync/device_registry.hpp
//
// `dlasync::device_registry` knows which devices exist in the job, which of
// them this process may address, and which backend serves each device kind
// in this build. Every import asks it about the source and the target
// device before it consumes a tensor.
//
// Example:
//
//   const dlasync::device_registry& registry = rt->registry();
//   registry.check_device({dlasync::device_kind::cpu, 1}, "target");  // OK
//   registry.check_device({dlasync::device_kind::cuda, 0}, "source");
//   // Unimplemented: "source device cuda:0 is not served by this build ..."
//
// A runtime makes its registry; users read it (runtime::registry()).
// A backend announces what it serves as `served_devices` entries; the host
// backend serves CPU memory and reads pinned CUDA host memory, and the CUDA
// backend adds its kinds when it is built and finds devices.
//
// Thread safety: a registry is immutable after creation; distinct and shared
// objects are safe to use from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlasync/device.hpp"

namespace dlasync {

// `dlasync::process_topology` says where this process stands among the
// processes of a job (its rank, the ranks on its node) and which devices it
// may address. Imports refuse a tensor on a device that belongs to another
// process, naming that process, instead of touching memory this process does
// not own.
//
// A topology is set in code or read from the variables that the usual
// launchers export:
//
//   | launcher  | rank                  | world size            | local rank                  | local world size                          |
//   |-----------|-----------------------|-----------------------|-----------------------------|-------------------------------------------|
//   | torchrun  | RANK                  | WORLD_SIZE            | LOCAL_RANK                  | LOCAL_WORLD_SIZE                          |
//   | Open MPI  | OMPI_COMM_WORLD_RANK  | OMPI_COMM_WORLD_SIZE  | OMPI_COMM_WORLD_LOCAL_RANK  | OMPI_COMM_WORLD_LOCAL_SIZE                |
//   | Slurm     | SLURM_PROCID          | SLURM_NTASKS          | SLURM_LOCALID               | SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE |
//   | override  | DLASYNC_RANK          | DLASYNC_WORLD_SIZE    | DLASYNC_LOCAL_RANK          | DLASYNC_LOCAL_WORLD_SIZE                  |
//
// The first launcher found in the order torchrun, Open MPI, Slurm gives the
// four numbers; each DLASYNC_* variable then overrides its field. Three more
// variables have no launcher equivalent:
//
//   DLASYNC_HOST_DEVICES           virtual host devices of this process (cpu:0..n-1)
//   DLASYNC_CUDA_DEVICES_PER_NODE  CUDA devices on this node (default: as found)
//   DLASYNC_CUDA_DEVICES           the CUDA ordinals this process owns, "0,2"
//
// Without DLASYNC_CUDA_DEVICES, the processes of a node share its CUDA
// devices round robin: local rank r owns ordinal d when
// d % local_world_size == r (one GPU per process in the common layout of
// 8 ranks on 8 GPUs). Ranks are assumed to be laid out node by node, so the
// owner of ordinal d has global rank (rank - local_rank) + d % local_world_size.
// Host devices are private to each process: every process has its own cpu:0.

// The largest number of virtual host devices a process may configure.
inline constexpr int max_host_devices = 1024;

struct process_topology {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // Virtual host devices of this process; cpu:0 is the real host memory and
  // the others let multi-device logic be exercised on a CPU.
  int host_device_count = 1;
  // CUDA devices on this node; empty means "as many as the CUDA backend finds".
  std::optional<int> cuda_devices_per_node;
  // The CUDA ordinals this process owns; empty means the round-robin rule.
  std::optional<std::vector<int>> cuda_ordinals;
  // Where the numbers came from: "default", "code", "torchrun", "Open MPI",
  // "Slurm", with " + DLASYNC_*" when an override applied.
  std::string source = "default";

  // One process with `host_devices` host devices.
  static process_topology single_process(int host_devices = 1);

  // Reads the launcher variables described above. A variable that is set but
  // malformed or out of range is an InvalidArgument error naming it.
  static absl::StatusOr<process_topology> from_environment();

  // As above, with `lookup` standing in for getenv (it returns nullptr for an
  // unset variable).
  using env_lookup = std::function<const char*(const char*)>;
  static absl::StatusOr<process_topology> from_environment(const env_lookup& lookup);

  // InvalidArgument when the numbers contradict each other (rank outside the
  // world, local world larger than the world, ...).
  absl::Status check() const;

  // Whether this process owns CUDA ordinal `ordinal` of its node.
  bool owns_cuda_ordinal(int ordinal) const;

  // The global rank that owns CUDA ordinal `ordinal` of this node, when the
  // round-robin rule applies; empty when ownership was set explicitly.
  std::optional<int> cuda_owner_rank(int ordinal) const;

  // "rank 1 of 4 (local rank 1 of 2, from torchrun)".
  std::string describe() const;
};

// What one backend serves of one device kind in this process.
struct served_devices {
  std::string backend;  // "host", "cuda", "cuda (simulated)"
  device_kind kind = device_kind::cpu;
  int count = 0;          // ordinals [0, count) exist on this node
  bool allocates = true;  // the backend can place copies on this kind
};

namespace detail {
struct device_registry_factory;
}  // namespace detail

class device_registry {
 public:
  const process_topology& topology() const noexcept { return topology_; }
  std::span<const served_devices> served() const noexcept { return served_; }

  // The entry serving `kind`, or nullptr.
  const served_devices* find(device_kind kind) const noexcept;

  // The devices this process may address, in kind then ordinal order.
  std::vector<device> addressable_devices() const;

  // OK when `d` exists and this process can read or write it through a
  // backend of this build. `role` ("source", "target") starts the message.
  //   InvalidArgument    unknown device type code or negative ordinal;
  //   FailedPrecondition the device belongs to another process;
  //   Unimplemented      no backend of this build serves the kind;
  //   NotFound           the ordinal does not exist here.
  absl::Status check_device(device d, const char* role) const;

  // "cpu:0, cpu:1, cuda_host:0".
  std::string addressable_list() const;

  // "cpu (host backend, 2 devices), cuda_host (host backend, 1 device)".
  std::string served_list() const;

 private:
  friend struct detail::device_registry_factory;
  device_registry(process_topology topology, std::vector<served_devices> served);

  int cuda_devices_on_node() const noexcept;

  process_topology topology_;
  std::vector<served_devices> served_;
};

}  // namespace dlasync
