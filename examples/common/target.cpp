#include "target.hpp"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dlasync::examples {

absl::StatusOr<device> choose_target(const runtime& rt, const std::string& flag) {
  if (flag == "auto") {
    for (const device& d : rt.registry().addressable_devices()) {
      if (d.kind == device_kind::cuda) return d;
    }
    return host_device;
  }
  absl::string_view rest = flag;
  device d;
  if (absl::ConsumePrefix(&rest, "cuda")) {
    d.kind = device_kind::cuda;
  } else if (absl::ConsumePrefix(&rest, "cpu")) {
    d.kind = device_kind::cpu;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", flag, " is not a device: use auto, cpu or cuda:N"));
  }
  if (!rest.empty() && (!absl::ConsumePrefix(&rest, ":") || !absl::SimpleAtoi(rest, &d.ordinal))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", flag, " is not a device: use auto, cpu or cuda:N"));
  }
  if (absl::Status s = rt.registry().check_device(d, "target"); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--device=", flag, ": ", s.message(),
                                               " (addressable: ", rt.registry().addressable_list(),
                                               "; --sim_gpus=N simulates GPUs)"));
  }
  return d;
}

std::string device_label(runtime& rt, device d) {
  return absl::StrCat(d.name(), " (", rt.describe(d), ")");
}

absl::StatusOr<std::optional<bool>> parse_copy_flag(const std::string& flag) {
  if (flag == "auto") return std::optional<bool>();
  if (flag == "true") return std::optional<bool>(true);
  if (flag == "false") return std::optional<bool>(false);
  return absl::InvalidArgumentError(absl::StrCat("--copy=", flag, ": use auto, true or false"));
}

}  // namespace dlasync::examples
