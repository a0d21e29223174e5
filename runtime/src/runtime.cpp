#include "dlasync/runtime.hpp"

#include "absl/strings/str_cat.h"
#include "runtime/src/device_registry_factory.hpp"
#include "runtime/src/runtime_core.hpp"
#include "runtime/src/status_macros.hpp"

namespace dlasync {

absl::StatusOr<std::unique_ptr<runtime>> runtime::create(runtime_options options) {
  return detail::create_runtime(std::move(options), {});
}

runtime::runtime(std::unique_ptr<detail::runtime_core> core) noexcept : core_(std::move(core)) {}

runtime::~runtime() = default;

runtime::executor_type runtime::get_executor() noexcept {
  return core_->executor();
}

const device_registry& runtime::registry() const noexcept {
  return core_->registry();
}

const runtime_options& runtime::options() const noexcept {
  return core_->options();
}

bool runtime::accepting() const noexcept {
  return core_->accepting();
}

std::size_t runtime::in_flight() const {
  return core_->in_flight();
}

runtime_stats runtime::stats() const noexcept {
  return core_->stats();
}

std::uint64_t runtime::handler_exceptions() const noexcept {
  return core_->handler_exceptions();
}

void runtime::shutdown() {
  core_->shutdown();
}

absl::StatusOr<device_buffer> runtime::allocate(device d, std::uint64_t bytes) {
  DLASYNC_RETURN_IF_ERROR(core_->registry().check_device(d, "allocation"));
  if (d.kind == device_kind::cpu) {
    return core_->host().allocate(d, bytes, alignof(std::max_align_t), {d, 0});
  }
  detail::cuda_backend* cuda = core_->cuda();
  if ((d.kind == device_kind::cuda || d.kind == device_kind::cuda_host) && cuda != nullptr) {
    return cuda->allocate_unordered(d, bytes);
  }
  if (d.kind == device_kind::cuda_host) {
    return absl::UnimplementedError(
        absl::StrCat("runtime::allocate cannot place page-locked memory on ", d.name(),
                     " without the CUDA backend (", cuda_support_note(), ")"));
  }
  return absl::UnimplementedError(absl::StrCat(
      "runtime::allocate places memory on cpu, cuda and cuda_host devices, not on ", d.name()));
}

std::string runtime::describe(device d) const {
  if (!core_->registry().check_device(d, "described").ok()) return "unknown";
  if (d.kind == device_kind::cpu) return "host memory";
  if (d.kind == device_kind::cuda_host) return "page-locked host memory";
  cuda::api* api = core_->cuda_api();
  cuda::device_properties p;
  if (api == nullptr || api->get_device_properties(&p, d.ordinal) != cuda::error::success) {
    return "unknown";
  }
  return d.kind == device_kind::cuda_managed ? absl::StrCat("managed memory of ", p.name) : p.name;
}

bool runtime::is_simulated(device d) const noexcept {
  const cuda::api* api = core_->cuda_api();
  return is_gpu_memory(d.kind) && api != nullptr && api->simulated();
}

}  // namespace dlasync
