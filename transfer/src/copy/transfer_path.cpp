#include "transfer/src/copy/transfer_path.hpp"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "transfer/src/copy/device_copy.hpp"
#include "transfer/src/copy/host_copy.hpp"
#include "transfer/src/validate/layout.hpp"

namespace dlasync::detail {
namespace {

absl::Status wrong_device(device claimed, std::uintptr_t address,
                          const std::optional<device>& actual) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the tensor says it lives on ", claimed.name(), " but its data pointer ", absl::Hex(address),
      " is ",
      actual ? absl::StrCat("memory of ", actual->name()) : std::string("not CUDA device memory"),
      "; the producer exported a wrong device: fix its DLDevice"));
}

// Where the CUDA runtime says the first element lies.
absl::StatusOr<std::optional<device>> locate(cuda_context& cuda, const import_plan& plan) {
  absl::StatusOr<std::optional<device>> where = cuda.device_of(first_element(plan));
  if (!where.ok()) {
    return absl::Status(where.status().code(),
                        absl::StrCat("cannot tell where the data of a tensor on ",
                                     plan.source.name(), " lives: ", where.status().message()));
  }
  return where;
}

}  // namespace

absl::StatusOr<transfer_path> choose_path(runtime_core& core, const import_plan& plan) {
  cuda_backend* cuda = core.cuda();
  const bool gpu_source = is_gpu_memory(plan.source.kind);
  if (gpu_source && cuda != nullptr && plan.element_count > 0) {
    absl::StatusOr<std::optional<device>> where = locate(cuda->context(), plan);
    if (!where.ok()) return where.status();
    if (*where != plan.source) return wrong_device(plan.source, plan.address, *where);
  }
  if (!plan.needs_copy()) {
    return plan.needs_wait() ? transfer_path::view_after_producer : transfer_path::view;
  }
  if (!gpu_source) {
    if (plan.target.kind != device_kind::cuda) return transfer_path::host_to_host;
    // Bound for a GPU: page-locked memory can go in one copy.
    bool pinned = false;
    if (cuda != nullptr && plan.element_count > 0) {
      absl::StatusOr<std::optional<device>> where = locate(cuda->context(), plan);
      if (!where.ok()) return where.status();
      if (*where && is_gpu_memory((*where)->kind)) {
        return wrong_device(plan.source, plan.address, *where);
      }
      pinned = where->has_value();
    }
    return pinned && plan.compact ? transfer_path::pinned_to_gpu : transfer_path::pageable_to_gpu;
  }
  if (plan.target.kind != device_kind::cuda) return transfer_path::gpu_to_host;
  return plan.target.ordinal == plan.source.ordinal ? transfer_path::within_gpu
                                                    : transfer_path::gpu_to_gpu;
}

int producer_gpu(const import_plan& plan) noexcept {
  if (is_gpu_memory(plan.source.kind)) return plan.source.ordinal;
  return plan.target.kind == device_kind::cuda ? plan.target.ordinal : 0;
}

device stream_device(transfer_path path, const import_plan& plan) noexcept {
  if (path == transfer_path::gpu_to_host) return {device_kind::cuda, plan.source.ordinal};
  return plan.target;
}

std::optional<byte_path> counted_path(transfer_path path) noexcept {
  switch (path) {
    case transfer_path::host_to_host: return byte_path::host_to_host;
    case transfer_path::pinned_to_gpu: return byte_path::pinned_to_gpu;
    case transfer_path::pageable_to_gpu: return byte_path::pageable_to_gpu;
    case transfer_path::gpu_to_host: return byte_path::gpu_to_host;
    case transfer_path::within_gpu: return byte_path::within_gpu;
    case transfer_path::gpu_to_gpu: return byte_path::gpu_to_gpu;
    case transfer_path::view:
    case transfer_path::view_after_producer: break;
  }
  return std::nullopt;
}

marker_ptr start_copy(runtime_core& core, stream_ref s, copy_request request) {
  const cuda::owner_scope tagged(request.control ? request.control->owner : 0);
  switch (request.path) {
    case transfer_path::host_to_host: return copy_on_host(core, s, std::move(request));
    case transfer_path::pinned_to_gpu:
    case transfer_path::within_gpu:
    case transfer_path::gpu_to_gpu: return copy_on_gpu(core, s, request);
    case transfer_path::pageable_to_gpu: return upload_through_staging(core, s, request);
    case transfer_path::gpu_to_host: return download_through_staging(core, s, std::move(request));
    case transfer_path::view:
    case transfer_path::view_after_producer: break;
  }
  return done_marker(absl::InternalError("start_copy was given a view, which copies nothing"));
}

}  // namespace dlasync::detail
