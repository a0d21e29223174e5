// How device registries are made: by the runtime, from its topology and
// what its backends serve, and by white-box tests. Users get a runtime's
// registry (runtime::registry()) and only read it.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "dlasync/device_registry.hpp"

namespace dlasync {

// The host backend's entries: `host_devices` CPU devices, and pinned CUDA
// host memory read as host memory (it cannot allocate pinned memory itself).
std::vector<served_devices> host_backend_devices(int host_devices);

// Why CUDA kinds are not served by this build: a sentence for messages.
const char* cuda_support_note() noexcept;

namespace detail {

struct device_registry_factory {
  // InvalidArgument when the topology is inconsistent or an entry repeats a
  // kind or has a negative count.
  static absl::StatusOr<device_registry> create(process_topology topology,
                                                std::vector<served_devices> served);

  // The host backend alone, for `topology`.
  static absl::StatusOr<device_registry> host_only(process_topology topology);
};

}  // namespace detail
}  // namespace dlasync
