// Test support: device registries for validation and views without a
// runtime.
#pragma once

#include "catch2/catch.hpp"
#include "dlasync/device_registry.hpp"
#include "runtime/src/device_registry_factory.hpp"

namespace dlasync::testing {

// The registry of one process with `host_devices` host devices and no other
// backend.
inline device_registry host_registry(int host_devices = 2) {
  absl::StatusOr<device_registry> r =
      detail::device_registry_factory::host_only(process_topology::single_process(host_devices));
  REQUIRE(r.ok());
  return *std::move(r);
}

}  // namespace dlasync::testing
