// dlasync/device_registry.hpp
//
// `dlasync::device_registry` knows which devices exist in the job, which of
// them this process may address, and which backend serves each device kind
// in this build. Every import asks it about the source and the target
// device before it consumes a tensor.
//
// Example:
//
//   auto registry = dlasync::device_registry::create(
//       dlasync::process_topology::single_process(2), {dlasync::host_backend_devices(2)});
//   registry->check_device({dlasync::device_kind::cpu, 1}, "target");  // OK
//   registry->check_device({dlasync::device_kind::cuda, 0}, "source");
//   // Unimplemented: "source device cuda:0 is not served by this build ..."
//
// A backend announces what it serves as `served_devices` entries; the host
// backend serves CPU memory and reads pinned CUDA host memory, and the CUDA
// backend adds its kinds when it is built and finds devices.
//
// Thread safety: a registry is immutable after creation; distinct and shared
// objects are safe to use from any thread.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlasync/device.hpp"
#include "dlasync/topology.hpp"

namespace dlasync {

// What one backend serves of one device kind in this process.
struct served_devices {
  std::string backend;  // "host", "cuda", "cuda (simulated)"
  device_kind kind = device_kind::cpu;
  int count = 0;          // ordinals [0, count) exist on this node
  bool allocates = true;  // the backend can place copies on this kind
};

// The host backend's entries: `host_devices` CPU devices, and pinned CUDA
// host memory read as host memory (it cannot allocate pinned memory itself).
std::vector<served_devices> host_backend_devices(int host_devices);

class device_registry {
 public:
  // InvalidArgument when the topology is inconsistent or an entry repeats a
  // kind or has a negative count.
  static absl::StatusOr<device_registry> create(process_topology topology,
                                                std::vector<served_devices> served);

  // The host backend alone, for `topology`.
  static absl::StatusOr<device_registry> host_only(process_topology topology);

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
  device_registry(process_topology topology, std::vector<served_devices> served);

  int cuda_devices_on_node() const noexcept;

  process_topology topology_;
  std::vector<served_devices> served_;
};

// Why CUDA kinds are not served by this build: a sentence for messages.
const char* cuda_support_note() noexcept;

}  // namespace dlasync
