#include "transfer/src/copy/transfer_path.hpp"

#include <optional>

#include "transfer/src/copy/device_copy.hpp"
#include "transfer/src/copy/host_copy.hpp"

namespace dlasync::detail {
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

marker_ptr start_copy(const copy_services& with, stream_slot s, copy_request request) {
  const cuda::owner_scope tagged(request.control ? request.control->owner : 0);
  switch (request.path) {
    case transfer_path::host_to_host: return copy_on_host(with, s, std::move(request));
    case transfer_path::pinned_to_gpu:
    case transfer_path::within_gpu:
    case transfer_path::gpu_to_gpu: return copy_on_gpu(with, s, request);
    case transfer_path::pageable_to_gpu: return upload_through_staging(with, s, request);
    case transfer_path::gpu_to_host: return download_through_staging(with, s, std::move(request));
    case transfer_path::view:
    case transfer_path::view_after_producer: break;
  }
  return done_marker(absl::InternalError("start_copy was given a view, which copies nothing"));
}

}  // namespace dlasync::detail
