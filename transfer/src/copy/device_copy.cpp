#include "transfer/src/copy/device_copy.hpp"

#include <optional>
#include <utility>
#include <vector>

#include "runtime/src/cuda/device_guard.hpp"
#include "runtime/src/planted.hpp"
#include "runtime/src/status_macros.hpp"
#include "transfer/src/copy/staging_pipeline.hpp"
#include "transfer/src/kernels/gather.hpp"

namespace dlasync::detail {
namespace {

// Orders `stream` (of `device`) after the point of the producer's stream
// that the import recorded when it was called, on the device. A marker
// that completed already needs no wait: the host has seen the producer get
// there (or the recording failed, which is the error).
absl::Status follow_producer(cuda_context& ctx, const copy_request& r, int device,
                             cuda::stream_t stream) {
  if (!r.produced || planted_mistake(planted::skip_producer_wait)) return absl::OkStatus();
  absl::Status status;
  if (ctx.wait_for(device, stream, r.produced.get(), status)) return status;
  return failed_at_once(r.produced);
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

path_stream enter_stream(const copy_services& with, stream_slot s, const copy_request& r) {
  path_stream on{with.cuda->shared_from_this(), s.device.ordinal, nullptr, nullptr};
  on.stream = on.context->stream(on.device, s.index);
  if (absl::Status st = follow_producer(*on.context, r, on.device, on.stream); !st.ok()) {
    on.done = done_marker(st);
  } else if (r.bytes == 0) {
    on.done = on.context->record(on.device, on.stream);
  }
  return on;
}

// Launches the gather on `stream`, with its device current.
absl::Status gather_on(cuda::api& api, int device, void* dst, const copy_request& r,
                       cuda::stream_t stream) {
  std::optional<device_guard> on;
  if (!planted_mistake(planted::launch_off_device)) {
    absl::StatusOr<device_guard> entered = device_guard::enter(api, device);
    if (!entered.ok()) return entered.status();
    on.emplace(*std::move(entered));
  }
  DLASYNC_CUDA_RETURN_IF_ERROR("dlasync gather kernel", device,
                               launch_gather(api, dst, r.from, r.layout, stream));
  return absl::OkStatus();
}

// A strided source on another GPU: compacted there into a temporary on
// stream `there`, then copied across on `stream` (of `device`); the
// temporary is freed on `there` once the copy has read it, on every path.
absl::Status compact_then_copy(const std::shared_ptr<cuda_context>& context, const copy_request& r,
                               int device, cuda::stream_t stream, int index) {
  cuda_context& ctx = *context;
  cuda::api& api = ctx.api();
  const int source_device = r.source.ordinal;
  cuda::stream_t there = ctx.stream(source_device, index);
  void* temp = nullptr;
  absl::Status st = [&]() -> absl::Status {
    {
      DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api, source_device));
      DLASYNC_CUDA_RETURN_IF_ERROR("cudaMallocAsync", source_device,
                                   api.malloc_async(&temp, r.bytes, there));
    }
    // The gather reads the source once the producer got there.
    DLASYNC_RETURN_IF_ERROR(ctx.order_after(source_device, there, device, stream));
    DLASYNC_RETURN_IF_ERROR(gather_on(api, source_device, temp, r, there));
    DLASYNC_RETURN_IF_ERROR(ctx.order_after(device, stream, source_device, there));
    DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api, device));
    DLASYNC_CUDA_RETURN_IF_ERROR(
        "cudaMemcpyAsync", device,
        api.memcpy_async(r.to, temp, r.bytes, cuda::memcpy_kind::any, stream));
    return absl::OkStatus();
  }();
  if (temp == nullptr) return st;
  // The free follows whatever reads the temporary on `stream`; when that
  // ordering fails, draining both streams first keeps the free safe.
  absl::Status ordered = planted_mistake(planted::early_temporary_free)
                             ? absl::OkStatus()
                             : ctx.order_after(source_device, there, device, stream);
  if (ordered.ok()) {
    absl::Status freed = ctx.release_memory(source_device, temp, there);
    return st.ok() ? freed : st;
  }
  ctx.drain({{device, stream}, {source_device, there}}, [context, source_device, temp, there] {
    (void)context->release_memory(source_device, temp, there);
  });
  return st.ok() ? ordered : st;
}

// The copy's one operation (or the compaction and the copy), on `stream`.
absl::Status enqueue(const std::shared_ptr<cuda_context>& context, const copy_request& r,
                     int device, cuda::stream_t stream, int index) {
  cuda::api& api = context->api();
  if (r.compact) {
    DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api, device));
    DLASYNC_CUDA_RETURN_IF_ERROR(
        "cudaMemcpyAsync", device,
        api.memcpy_async(r.to, r.from, r.bytes, cuda::memcpy_kind::any, stream));
    return absl::OkStatus();
  }
  if (r.source.ordinal == device) return gather_on(api, device, r.to, r, stream);
  return compact_then_copy(context, r, device, stream, index);
}

}  // namespace

marker_ptr copy_on_gpu(const copy_services& with, stream_slot s, const copy_request& request) {
  const path_stream on = enter_stream(with, s, request);
  if (on.done) return on.done;
  const std::shared_ptr<cuda_context>& context = on.context;
  cuda_context& ctx = *context;
  const int device = on.device;
  cuda::stream_t stream = on.stream;
  absl::Status status = enqueue(context, request, device, stream, s.index);
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

marker_ptr upload_through_staging(const copy_services& with, stream_slot s,
                                  const copy_request& request) {
  const path_stream on = enter_stream(with, s, request);
  if (on.done) return on.done;
  // The plan refused uploads whose rows do not fit a chunk.
  auto p = staging_pipeline::upload(on.context, *with.workers, on.device, request);
  p->start(on.stream);
  return p->done();
}

marker_ptr download_through_staging(const copy_services& with, stream_slot s,
                                    copy_request request) {
  const path_stream on = enter_stream(with, s, request);
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
      {
        DLASYNC_ASSIGN_OR_RETURN(device_guard on, device_guard::enter(api, device));
        DLASYNC_CUDA_RETURN_IF_ERROR("cudaMallocAsync", device,
                                     api.malloc_async(&temp, request.bytes, stream));
      }
      return gather_on(api, device, temp, request, stream);
    }();
    if (!st.ok()) {
      if (temp != nullptr) (void)ctx.release_memory(device, temp, stream);
      return done_marker(st);
    }
    compact_source = temp;
  }
  copy_request out = std::move(request);
  out.layout = strided_layout{1, {static_cast<std::int64_t>(out.bytes)}, {1}};
  auto p = staging_pipeline::download(context, *with.workers, device, out, compact_source);
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
