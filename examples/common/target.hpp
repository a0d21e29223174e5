// Example support: the examples' device and copy flags.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "dlasync/dlasync.hpp"

namespace dlasync::examples {

// The device a --device flag names: "auto" is the first GPU this process may
// address, else the host; "cpu", "cpu:N" and "cuda:N" must be addressable.
absl::StatusOr<device> choose_target(const runtime& rt, const std::string& flag);

// "cuda:0 (NVIDIA H200)", "cuda:1 (dlasync simulated GPU 1)", "cpu:0 (host)".
std::string device_label(runtime& rt, device d);

// The import's copy argument from "auto", "true" or "false".
absl::StatusOr<std::optional<bool>> parse_copy_flag(const std::string& flag);

}  // namespace dlasync::examples
