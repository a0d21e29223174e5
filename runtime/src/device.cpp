#include "dlasync/device.hpp"

#include "absl/strings/str_cat.h"

namespace dlasync {

const char* device_kind_name(device_kind kind) noexcept {
  switch (kind) {
    case device_kind::cpu: return "cpu";
    case device_kind::cuda: return "cuda";
    case device_kind::cuda_host: return "cuda_host";
    case device_kind::opencl: return "opencl";
    case device_kind::vulkan: return "vulkan";
    case device_kind::metal: return "metal";
    case device_kind::vpi: return "vpi";
    case device_kind::rocm: return "rocm";
    case device_kind::rocm_host: return "rocm_host";
    case device_kind::ext_dev: return "ext_dev";
    case device_kind::cuda_managed: return "cuda_managed";
    case device_kind::oneapi: return "oneapi";
    case device_kind::webgpu: return "webgpu";
    case device_kind::hexagon: return "hexagon";
    case device_kind::maia: return "maia";
    case device_kind::trn: return "trn";
    case device_kind::tpu: return "tpu";
    case device_kind::tpu_host: return "tpu_host";
  }
  return "unknown";
}

std::string device::name() const {
  const auto code = static_cast<std::int32_t>(kind);
  if (!is_known_device_kind(code)) return absl::StrCat("device_type_", code, ":", ordinal);
  return absl::StrCat(device_kind_name(kind), ":", ordinal);
}

std::ostream& operator<<(std::ostream& os, const device& d) {
  return os << d.name();
}

}  // namespace dlasync
