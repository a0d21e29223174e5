#include "dlasync/gpu_stream.hpp"

#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/src/cuda/device_guard.hpp"
#include "runtime/src/runtime_core.hpp"
#include "runtime/src/status_macros.hpp"

namespace dlasync {
namespace {

// The CUDA context of `rt` when `gpu` is one of its GPUs.
absl::StatusOr<detail::cuda_context*> context_for(runtime& rt, device gpu) {
  if (gpu.kind != device_kind::cuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        gpu.name(), " is not a GPU: streams belong to cuda devices (cuda:0, cuda:1, ...)"));
  }
  DLASYNC_RETURN_IF_ERROR(rt.registry().check_device(gpu, "stream"));
  detail::cuda_backend* cuda = detail::core_of(rt).cuda();
  if (cuda == nullptr) return absl::InternalError("a served GPU without a CUDA backend");
  return &cuda->context();
}

}  // namespace

namespace detail {

void when_stream_reaches(runtime& rt, device gpu, std::int64_t stream,
                         absl::AnyInvocable<void(absl::Status) &&> done) {
  absl::StatusOr<cuda_context*> context = context_for(rt, gpu);
  if (!context.ok()) return std::move(done)(context.status());
  if (stream < stream_legacy_default) {
    return std::move(done)(absl::InvalidArgumentError(absl::StrCat(
        "stream ", stream,
        " names no stream to wait for; use 1 (legacy default), 2 (per-thread default) or a "
        "stream handle")));
  }
  marker_ptr reached = (*context)->record_producer(gpu.ordinal, stream);
  reached->on_complete([done = std::move(done)](absl::Status status) mutable {
    std::move(done)(std::move(status));
  });
}

}  // namespace detail

absl::StatusOr<gpu_stream> gpu_stream::create(runtime& rt, dlasync::device gpu) {
  DLASYNC_ASSIGN_OR_RETURN(detail::cuda_context * context, context_for(rt, gpu));
  cuda::api& api = context->api();
  DLASYNC_ASSIGN_OR_RETURN(detail::device_guard on, detail::device_guard::enter(api, gpu.ordinal));
  cuda::stream_t handle = nullptr;
  DLASYNC_CUDA_RETURN_IF_ERROR("cudaStreamCreateWithFlags", gpu.ordinal,
                               api.stream_create(&handle, cuda::stream_flags::non_blocking));
  return gpu_stream(rt, gpu, handle);
}

gpu_stream& gpu_stream::operator=(gpu_stream&& other) noexcept {
  if (this != &other) {
    destroy();
    rt_ = other.rt_;
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

gpu_stream::~gpu_stream() {
  destroy();
}

void gpu_stream::destroy() noexcept {
  if (handle_ == nullptr) return;
  cuda::api* api = detail::core_of(*rt_).cuda_api();
  absl::StatusOr<detail::device_guard> on = detail::device_guard::enter(*api, device_.ordinal);
  if (on.ok()) (void)api->stream_destroy(std::exchange(handle_, nullptr));
}

absl::Status gpu_stream::copy_async(void* dst, const void* src, std::size_t bytes) {
  cuda::api& api = *detail::core_of(*rt_).cuda_api();
  DLASYNC_ASSIGN_OR_RETURN(detail::device_guard on,
                           detail::device_guard::enter(api, device_.ordinal));
  DLASYNC_CUDA_RETURN_IF_ERROR("cudaMemcpyAsync", device_.ordinal,
                               api.memcpy_async(dst, src, bytes, cuda::memcpy_kind::any, handle_));
  return absl::OkStatus();
}

absl::Status gpu_stream::launch_host_function(absl::AnyInvocable<void() &&> fn) {
  cuda::api& api = *detail::core_of(*rt_).cuda_api();
  DLASYNC_ASSIGN_OR_RETURN(detail::device_guard on,
                           detail::device_guard::enter(api, device_.ordinal));
  // std::function must be copyable: the one-shot callable travels behind a
  // shared pointer.
  auto call = std::make_shared<absl::AnyInvocable<void() &&>>(std::move(fn));
  DLASYNC_CUDA_RETURN_IF_ERROR("cudaLaunchHostFunc", device_.ordinal,
                               api.launch_host_func(handle_, [call] { std::move (*call)(); }));
  return absl::OkStatus();
}

absl::Status gpu_stream::synchronize() {
  cuda::api& api = *detail::core_of(*rt_).cuda_api();
  DLASYNC_ASSIGN_OR_RETURN(detail::device_guard on,
                           detail::device_guard::enter(api, device_.ordinal));
  cuda::event_t e = nullptr;
  DLASYNC_CUDA_RETURN_IF_ERROR("cudaEventCreateWithFlags", device_.ordinal, api.event_create(&e));
  absl::Status status;
  if (const cuda::error recorded = api.event_record(e, handle_); recorded != cuda::error::success) {
    status = cuda::to_status(recorded, "cudaEventRecord", device_.ordinal);
  } else {
    // Yield between queries: a tight loop would take a core from the work
    // (and, on a simulated GPU, from the threads that simulate it).
    cuda::error done = api.event_query(e);
    for (; done == cuda::error::not_ready; done = api.event_query(e)) std::this_thread::yield();
    if (done != cuda::error::success)
      status = cuda::to_status(done, "cudaEventQuery", device_.ordinal);
  }
  (void)api.event_destroy(e);
  return status;
}

}  // namespace dlasync
