#include "runtime/src/cuda/cuda_backend.hpp"

#include "runtime/src/cuda/device_guard.hpp"
#include "runtime/src/status_macros.hpp"

namespace dlasync::detail {

absl::StatusOr<std::unique_ptr<cuda_backend>> cuda_backend::create(
    std::shared_ptr<cuda::api> api, const cuda_options& options,
    const std::function<bool(int)>& owns) {
  int count = 0;
  DLASYNC_CUDA_RETURN_IF_ERROR("cudaGetDeviceCount", -1, api->get_device_count(&count));
  std::vector<bool> served(static_cast<std::size_t>(count));
  for (int d = 0; d < count; ++d) served[static_cast<std::size_t>(d)] = owns(d);
  for (int d = 0; d < count; ++d) {
    for (int peer = 0; peer < count; ++peer) {
      if (peer == d || !served[static_cast<std::size_t>(d)] ||
          !served[static_cast<std::size_t>(peer)]) {
        continue;
      }
      int can = 0;
      if (api->device_can_access_peer(&can, d, peer) != cuda::error::success || can == 0) continue;
      // Best effort: copies between GPUs work without peer access. Memory
      // of d's stream-ordered pool reaches `peer` only with pool access
      // (the pool does not follow peer access), which strided peer copies
      // and copies of imported tensors need.
      absl::StatusOr<device_guard> on = device_guard::enter(*api, d);
      if (!on.ok()) continue;
      if (api->device_enable_peer_access(peer) == cuda::error::peer_access_already_enabled) {
        // Enabled before (by the caller, or another runtime): not an error,
        // and it must not linger as this thread's last error.
        (void)api->get_last_error();
      }
      if (api->mem_pool_set_access(d, peer) != cuda::error::success) {
        (void)api->get_last_error();
      }
    }
  }
  DLASYNC_ASSIGN_OR_RETURN(std::shared_ptr<cuda_context> context,
                           cuda_context::create(std::move(api), options, served));
  return std::unique_ptr<cuda_backend>(new cuda_backend(std::move(context)));
}

cuda_backend::~cuda_backend() = default;

const char* cuda_backend::name() const noexcept {
  return context_->api().simulated() ? "cuda (simulated)" : "cuda";
}

std::vector<served_devices> cuda_backend::served() const {
  // Managed memory is read in place (views on its GPU) or copied from; the
  // backend never places copies there.
  // Page-locked host memory (one cuda_host device) takes copies: an import
  // onto cuda_host lands in cudaMallocHost memory.
  return {{name(), device_kind::cuda, context_->device_count(), true},
          {name(), device_kind::cuda_managed, context_->device_count(), false},
          {name(), device_kind::cuda_host, 1, true}};
}

absl::StatusOr<device_buffer> cuda_backend::allocate(device d, std::uint64_t bytes,
                                                     std::size_t alignment, stream_slot s,
                                                     const free_stream_cell& free_stream) {
  if (bytes == 0) return device_buffer(d, nullptr, 0, nullptr);
  if (d.kind == device_kind::cuda_host) return allocate_pinned(d, bytes, alignment);
  cuda::stream_t stream = context_->stream(d.ordinal, s.index);
  // Pools hand out 256-byte aligned blocks; more is asked of by padding.
  const std::uint64_t pad = alignment > 256 ? alignment : 0;
  void* base = nullptr;
  {
    DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(context_->api(), d.ordinal));
    DLASYNC_CUDA_RETURN_IF_ERROR("cudaMallocAsync", d.ordinal,
                                 context_->api().malloc_async(&base, bytes + pad, stream));
  }
  // The first aligned byte of the block: an offset into it, not a cast.
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  const std::uint64_t skip = pad == 0 ? 0 : (alignment - address % alignment) % alignment;
  if (free_stream) free_stream->store(reinterpret_cast<std::intptr_t>(stream));
  return device_buffer(
      d, static_cast<char*>(base) + skip, bytes,
      [context = context_, base, stream, ordinal = d.ordinal, free_stream](void*, std::uint64_t) {
        // The allocation's stream, or the one the tensor's
        // holder named (tensor::set_stream).
        const cuda::stream_t on =
            free_stream ? reinterpret_cast<cuda::stream_t>(  // NOLINT(performance-no-int-to-ptr)
                              static_cast<std::intptr_t>(free_stream->load()))
                        : stream;
        (void)context->release_memory(ordinal, base, on);
      });
}

absl::StatusOr<device_buffer> cuda_backend::allocate_pinned(device d, std::uint64_t bytes,
                                                            std::size_t alignment) {
  // cudaMallocHost hands out page-aligned blocks; more is asked of by padding.
  const std::uint64_t pad = alignment > 4096 ? alignment : 0;
  void* base = nullptr;
  DLASYNC_CUDA_RETURN_IF_ERROR("cudaMallocHost", -1,
                               context_->api().malloc_host(&base, bytes + pad));
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  const std::uint64_t skip = pad == 0 ? 0 : (alignment - address % alignment) % alignment;
  return device_buffer(
      d, static_cast<char*>(base) + skip, bytes,
      [context = context_, base](void*, std::uint64_t) { (void)context->api().free_host(base); });
}

absl::StatusOr<device_buffer> cuda_backend::allocate_unordered(device d, std::uint64_t bytes) {
  if (bytes == 0) return device_buffer(d, nullptr, 0, nullptr);
  if (d.kind == device_kind::cuda_host) return allocate_pinned(d, bytes, 0);
  cuda::api& api = context_->api();
  void* p = nullptr;
  DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api, d.ordinal));
  DLASYNC_CUDA_RETURN_IF_ERROR("cudaMalloc", d.ordinal, api.malloc_device(&p, bytes));
  return device_buffer(
      d, p, bytes, [context = context_, ordinal = d.ordinal](void* data, std::uint64_t) {
        absl::StatusOr<device_guard> on = device_guard::enter(context->api(), ordinal);
        if (on.ok()) (void)context->api().free_device(data);
      });
}

}  // namespace dlasync::detail
