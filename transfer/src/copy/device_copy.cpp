#include "transfer/src/copy/device_copy.hpp"

#include <utility>
#include <vector>

#include "runtime/src/cuda/device_guard.hpp"
#include "runtime/src/status_macros.hpp"
#include "transfer/src/copy/gather.hpp"
#include "transfer/src/copy/staging_pipeline.hpp"

namespace dlasync::detail {
namespace {

// Orders `stream` (of `device`) after the producer's stream, on the device:
// the stream of the source's GPU, or for pinned host memory one of the GPU
// that copies.
absl::Status follow_producer(cuda_context& ctx, const copy_request& r, int device,
                             cuda::stream_t stream) {
  if (r.producer_stream == stream_no_sync) return absl::OkStatus();
  const cuda::stream_t producer = cuda::stream_from_dlpack(r.producer_stream);
  const int producer_device = is_gpu_memory(r.source.kind) ? r.source.ordinal : device;
  return ctx.order_after(producer_device, stream, producer);
}

// Where a GPU path runs: stream `s` of the CUDA context, ordered after the
// producer's stream. `done` is set when nothing more is to be enqueued:
// the producer could not be followed, or there are no bytes to move.
struct path_stream {
  std::shared_ptr<cuda_context> context;
  int device;
  cuda::stream_t stream;
  marker_ptr done;
};

path_stream enter_stream(runtime_core& core, stream_ref s, const copy_request& r) {
  path_stream on{core.cuda()->shared_context(), s.device.ordinal, nullptr, nullptr};
  on.stream = on.context->stream(on.device, s.index);
  if (absl::Status st = follow_producer(*on.context, r, on.device, on.stream); !st.ok()) {
    on.done = done_marker(st);
  } else if (r.bytes == 0) {
    on.done = on.context->record(on.device, on.stream);
  }
  return on;
}

// A strided source on another GPU: compacted there into a temporary, then
// copied across on `stream`; the temporary is freed after the copy.
absl::Status compact_then_copy(cuda_context& ctx, const copy_request& r, int device,
                               cuda::stream_t stream, int index) {
  cuda::api& api = ctx.api();
  const int source_device = r.source.ordinal;
  cuda::stream_t there = ctx.stream(source_device, index);
  void* temp = nullptr;
  absl::Status st = [&]() -> absl::Status {
    DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api, source_device));
    DLASYNC_CUDA_RETURN_IF_ERROR("cudaMallocAsync", source_device,
                                 api.malloc_async(&temp, r.bytes, there));
    DLASYNC_RETURN_IF_ERROR(ctx.order_after(source_device, there, stream));
    DLASYNC_CUDA_RETURN_IF_ERROR("dlasync gather kernel", source_device,
                                 launch_gather(api, temp, r.from, r.layout, there));
    return ctx.order_after(source_device, stream, there);
  }();
  if (st.ok()) {
    const cuda::error copied =
        api.memcpy_async(r.to, temp, r.bytes, cuda::memcpy_kind::any, stream);
    if (copied != cuda::error::success) st = cuda::to_status(copied, "cudaMemcpyAsync", device);
  }
  if (!st.ok()) {
    // Whatever was enqueued on `there` is ordered before the free.
    if (temp != nullptr) (void)ctx.release_memory(source_device, temp, there);
    return st;
  }
  DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api, source_device));
  DLASYNC_RETURN_IF_ERROR(ctx.order_after(source_device, there, stream));
  return ctx.release_memory(source_device, temp, there);
}

// The copy's one operation (or the compaction and the copy), on `stream`.
absl::Status enqueue(cuda_context& ctx, const copy_request& r, int device, cuda::stream_t stream,
                     int index) {
  cuda::api& api = ctx.api();
  DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api, device));
  if (r.compact) {
    DLASYNC_CUDA_RETURN_IF_ERROR(
        "cudaMemcpyAsync", device,
        api.memcpy_async(r.to, r.from, r.bytes, cuda::memcpy_kind::any, stream));
    return absl::OkStatus();
  }
  if (r.source.ordinal == device) {
    DLASYNC_CUDA_RETURN_IF_ERROR("dlasync gather kernel", device,
                                 launch_gather(api, r.to, r.from, r.layout, stream));
    return absl::OkStatus();
  }
  return compact_then_copy(ctx, r, device, stream, index);
}

}  // namespace

marker_ptr copy_on_gpu(runtime_core& core, stream_ref s, const copy_request& request) {
  const path_stream on = enter_stream(core, s, request);
  if (on.done) return on.done;
  const std::shared_ptr<cuda_context>& context = on.context;
  cuda_context& ctx = *context;
  const int device = on.device;
  cuda::stream_t stream = on.stream;
  absl::Status status = enqueue(ctx, request, device, stream, s.index);
  marker_ptr copied = status.ok() ? ctx.record(device, stream) : nullptr;
  if (copied != nullptr) status = failed_at_once(copied);
  if (status.ok()) return copied;
  // Part of the work may be enqueued (a gather reading the source on its
  // GPU): the failure is reported once the streams have run it, so that
  // the import releases the source and the destination only then.
  std::vector<device_stream> used{{device, stream}};
  if (is_gpu_memory(request.source.kind) && request.source.ordinal != device) {
    used.emplace_back(request.source.ordinal, ctx.stream(request.source.ordinal, s.index));
  }
  auto failed = std::make_shared<completion_marker>();
  // The callback holds the context: its reactor must outlive the drain.
  ctx.drain(used, [failed, status, context] { failed->complete(status); });
  return failed;
}

marker_ptr upload_through_staging(runtime_core& core, stream_ref s, const copy_request& request) {
  const path_stream on = enter_stream(core, s, request);
  if (on.done) return on.done;
  auto p = staging_pipeline::upload(on.context, core.workers(), on.device, request);
  if (!p->fits()) {
    return done_marker(absl::UnimplementedError(
        "a single row of this strided source is larger than a staging chunk; raise "
        "runtime_options::staging_chunk_bytes or make the source contiguous first"));
  }
  p->start(on.stream);
  return p->done();
}

marker_ptr download_through_staging(runtime_core& core, stream_ref s, copy_request request) {
  const path_stream on = enter_stream(core, s, request);
  if (on.done) return on.done;
  const std::shared_ptr<cuda_context>& context = on.context;
  cuda_context& ctx = *context;
  cuda::api& api = ctx.api();
  const int device = on.device;
  cuda::stream_t stream = on.stream;
  // Compact on the device first when strided, then stream the compact
  // bytes out through staging chunks.
  const void* compact_source = request.from;
  void* temp = nullptr;
  if (!request.compact) {
    absl::Status st = [&]() -> absl::Status {
      DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api, device));
      DLASYNC_CUDA_RETURN_IF_ERROR("cudaMallocAsync", device,
                                   api.malloc_async(&temp, request.bytes, stream));
      DLASYNC_CUDA_RETURN_IF_ERROR("dlasync gather kernel", device,
                                   launch_gather(api, temp, request.from, request.layout, stream));
      return absl::OkStatus();
    }();
    if (!st.ok()) {
      if (temp != nullptr) (void)ctx.release_memory(device, temp, stream);
      return done_marker(st);
    }
    compact_source = temp;
  }
  copy_request out = std::move(request);
  out.layout = strided_layout{1, {static_cast<std::int64_t>(out.bytes)}, {1}};
  auto p = staging_pipeline::download(context, core.workers(), device, out, compact_source);
  p->start(stream);
  if (temp == nullptr) return p->done();
  auto freed = std::make_shared<completion_marker>();
  p->done()->on_complete([context, temp, stream, device, freed](const absl::Status& st) {
    (void)context->release_memory(device, temp, stream);
    freed->complete(st);
  });
  return freed;
}

}  // namespace dlasync::detail
