#include "runtime/src/device_registry_factory.hpp"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlasync {
namespace {

// Kinds whose ordinal names a GPU: the GPU's own memory and its managed
// memory. Both belong to the process that owns the GPU.
bool is_cuda_ordinal_kind(device_kind kind) {
  return kind == device_kind::cuda || kind == device_kind::cuda_managed;
}

}  // namespace

std::vector<served_devices> host_backend_devices(int host_devices) {
  return {
      {"host", device_kind::cpu, host_devices, true},
      {"host", device_kind::cuda_host, 1, false},
  };
}

const char* cuda_support_note() noexcept {
#if defined(DLASYNC_HAS_CUDA)
  return "CUDA support is configured in this build, but no CUDA backend serves this process";
#else
  return "this build has no CUDA support (configure with -DDLASYNC_WITH_CUDA=ON and a CUDA "
         "toolkit)";
#endif
}

device_registry::device_registry(process_topology topology, std::vector<served_devices> served)
    : topology_(std::move(topology)), served_(std::move(served)) {}

absl::StatusOr<device_registry> detail::device_registry_factory::create(
    process_topology topology, std::vector<served_devices> served) {
  if (absl::Status s = topology.check(); !s.ok()) return s;
  for (std::size_t i = 0; i < served.size(); ++i) {
    if (served[i].count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("backend ", served[i].backend, " announces ", served[i].count, " ",
                       device_kind_name(served[i].kind), " devices; a count must be >= 0"));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (served[j].kind == served[i].kind) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device kind ", device_kind_name(served[i].kind), " is served by both backend ",
            served[j].backend, " and backend ", served[i].backend, "; give it to one"));
      }
    }
  }
  return device_registry(std::move(topology), std::move(served));
}

absl::StatusOr<device_registry> detail::device_registry_factory::host_only(
    process_topology topology) {
  const int host_devices = topology.host_device_count;
  return create(std::move(topology), host_backend_devices(host_devices));
}

const served_devices* device_registry::find(device_kind kind) const noexcept {
  for (const served_devices& s : served_) {
    if (s.kind == kind) return &s;
  }
  return nullptr;
}

int device_registry::cuda_devices_on_node() const noexcept {
  if (topology_.cuda_devices_per_node) return *topology_.cuda_devices_per_node;
  const served_devices* cuda = find(device_kind::cuda);
  return cuda != nullptr ? cuda->count : 0;
}

std::vector<device> device_registry::addressable_devices() const {
  std::vector<device> devices;
  for (const served_devices& s : served_) {
    for (int ordinal = 0; ordinal < s.count; ++ordinal) {
      if (is_cuda_ordinal_kind(s.kind) && !topology_.owns_cuda_ordinal(ordinal)) continue;
      devices.push_back({s.kind, ordinal});
    }
  }
  std::sort(devices.begin(), devices.end(), [](const device& a, const device& b) {
    return a.kind != b.kind ? a.kind < b.kind : a.ordinal < b.ordinal;
  });
  return devices;
}

std::string device_registry::addressable_list() const {
  const std::vector<device> devices = addressable_devices();
  if (devices.empty()) return "none";
  return absl::StrJoin(devices, ", ",
                       [](std::string* out, const device& d) { out->append(d.name()); });
}

std::string device_registry::served_list() const {
  std::vector<std::string> parts;
  for (const served_devices& s : served_) {
    parts.push_back(absl::StrCat(device_kind_name(s.kind), " (", s.backend, " backend, ", s.count,
                                 s.count == 1 ? " device)" : " devices)"));
  }
  return parts.empty() ? std::string("nothing") : absl::StrJoin(parts, ", ");
}

absl::Status device_registry::check_device(device d, const char* role) const {
  const auto code = static_cast<std::int32_t>(d.kind);
  if (!is_known_device_kind(code)) {
    return absl::InvalidArgumentError(
        absl::StrCat(role, " device type ", code,
                     " is not a DLPack device type (known: 1-4 and 7-20); the producer wrote a "
                     "corrupt or foreign DLDevice"));
  }
  if (d.ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(role, " device ", d.name(), " has a negative device_id; ordinals start at 0"));
  }
  if (is_cuda_ordinal_kind(d.kind) && d.ordinal < cuda_devices_on_node() &&
      !topology_.owns_cuda_ordinal(d.ordinal)) {
    const std::optional<int> owner = topology_.cuda_owner_rank(d.ordinal);
    return absl::FailedPreconditionError(
        absl::StrCat(role, " device ", d.name(), " is not addressable by this process (",
                     topology_.describe(), "): it belongs to ",
                     owner ? absl::StrCat("process rank ", *owner) : std::string("another process"),
                     ". This process addresses ", addressable_list(), ". Import the tensor on ",
                     owner ? absl::StrCat("rank ", *owner) : std::string("its owning process"),
                     ", copy it to one of this process's devices first, or have ",
                     owner ? absl::StrCat("rank ", *owner) : std::string("that process"),
                     " publish it and import it here with dlasync's remote import "
                     "(dlasync::import_remote, over UCX)"));
  }
  const served_devices* served = find(d.kind);
  if (served == nullptr) {
    std::string note;
    if (is_gpu_memory(d.kind)) {
      note = absl::StrCat(" (", cuda_support_note(), ")");
    }
    return absl::UnimplementedError(absl::StrCat(role, " device ", d.name(),
                                                 " is not served by this build", note,
                                                 "; this build serves ", served_list()));
  }
  if (d.ordinal >= served->count) {
    return absl::NotFoundError(absl::StrCat(
        role, " device ", d.name(), " does not exist in this process: ", device_kind_name(d.kind),
        " has ", served->count, served->count == 1 ? " device" : " devices",
        ". This process addresses ", addressable_list()));
  }
  return absl::OkStatus();
}

}  // namespace dlasync
