// dlasync/gpu_stream.hpp
//
// `dlasync::gpu_stream` owns one CUDA stream of one GPU of a runtime, real
// or simulated: a stream for the caller's own work. Its DLPack value
// (`dlpack_stream()`) is what `import_options::stream` and
// `consumer_stream` take, so that the caller's kernels can produce a tensor
// that an import then reads, or consume the tensor an import wrote, ordered
// on the device with no host round trip.
//
// Example, a handler that sums an imported tensor on the GPU:
//
//   absl::StatusOr<dlasync::gpu_stream> s = dlasync::gpu_stream::create(rt, gpu);
//   dlasync::import_options o;
//   o.target = gpu;
//   o.consumer_stream = s->dlpack_stream();     // the import resumes early
//   auto t = co_await dlasync::import_dlpack(rt, source, o);
//   launch_sum(t->data(), s->native_handle());  // the caller's kernel, in order
//   absl::Status done = co_await s->async_wait(asio::use_awaitable);
//
// Ownership: the stream is created by `create` and destroyed with the
// object; work still queued on it runs first, as with cudaStreamDestroy. A
// gpu_stream must be destroyed before its runtime. Move-only.
//
// Thread safety: distinct objects are safe. A shared object is safe for
// the const members and for enqueuing (copy_async, launch_host_function,
// synchronize, async_wait), as CUDA streams are; not for move or
// destruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "asio/async_result.hpp"
#include "dlasync/detail/deliver.hpp"
#include "dlasync/device.hpp"
#include "dlasync/dlpack_stream.hpp"
#include "dlasync/runtime.hpp"

namespace dlasync {

namespace detail {
// Calls `done` once the work enqueued so far on `stream` (DLPack encoding)
// of GPU `gpu` has run, on whichever thread sees it; with the stream's
// error, or the error of recording the point to wait for.
void when_stream_reaches(runtime& rt, device gpu, std::int64_t stream,
                         absl::AnyInvocable<void(absl::Status) &&> done);
}  // namespace detail

class gpu_stream {
 public:
  // A new non-blocking stream on `gpu`, a CUDA device of `rt`.
  //   InvalidArgument  `gpu` is not a cuda device;
  //   NotFound, FailedPrecondition, Unimplemented  as the registry says of
  //                    a device this process does not serve;
  //   the CUDA error of cudaStreamCreateWithFlags otherwise.
  static absl::StatusOr<gpu_stream> create(runtime& rt, dlasync::device gpu);

  gpu_stream(gpu_stream&& other) noexcept
      : rt_(other.rt_), device_(other.device_), handle_(std::exchange(other.handle_, nullptr)) {}
  gpu_stream& operator=(gpu_stream&& other) noexcept;
  gpu_stream(const gpu_stream&) = delete;
  gpu_stream& operator=(const gpu_stream&) = delete;
  ~gpu_stream();

  dlasync::device device() const noexcept { return device_; }

  // The stream as DLPack encodes it, for import_options::stream and
  // import_options::consumer_stream.
  std::int64_t dlpack_stream() const noexcept { return reinterpret_cast<std::int64_t>(handle_); }

  // The `cudaStream_t` of a real GPU, for the caller's own kernels. On a
  // simulated GPU it names a simulated stream that only this class and
  // dlasync's imports can use.
  void* native_handle() const noexcept { return handle_; }

  // Enqueues a copy of `bytes` from `src` to `dst`, wherever each lives, as
  // cudaMemcpyAsync with cudaMemcpyDefault does: from pageable host memory
  // the call returns once the bytes are staged. The caller keeps both alive
  // until the stream has run the copy. The CUDA error of the call, if any.
  absl::Status copy_async(void* dst, const void* src, std::size_t bytes);

  // Enqueues `fn` to run on a thread of the CUDA runtime once everything
  // enqueued before it has run, as cudaLaunchHostFunc does; work enqueued
  // after it waits for it. `fn` must not call CUDA. On a simulated GPU this
  // is how a caller's "kernel" runs in stream order.
  absl::Status launch_host_function(absl::AnyInvocable<void() &&> fn);

  // Blocks the calling thread until everything enqueued so far has run.
  // The stream's error, if it failed.
  absl::Status synchronize();

  // Waits without blocking a thread until everything enqueued on the
  // stream before the call has run.
  //
  // Returns immediately. The handler is called exactly once, never from
  // inside this function, on its associated executor (the runtime's when
  // it has none). Completion signature: void(absl::Status): OK, or the
  // stream's error. The wait cannot be cancelled.
  template <typename CompletionToken>
  auto async_wait(CompletionToken&& token);

 private:
  gpu_stream(runtime& rt, dlasync::device d, void* handle) noexcept
      : rt_(&rt), device_(d), handle_(handle) {}
  void destroy() noexcept;

  runtime* rt_;
  dlasync::device device_;
  void* handle_;
};

// Waits without blocking a thread until the work enqueued so far on the
// stream `stream` of GPU `gpu` has run: any stream of the caller's, given
// as DLPack encodes it (a cudaStream_t as an integer, or 1 or 2 for the
// default streams; see dlasync/dlpack_stream.hpp).
//
// Returns immediately. The handler is called exactly once, never from
// inside this function, on its associated executor (the runtime's when it
// has none). Completion signature: void(absl::Status): OK; the CUDA error
// of recording the point to wait for or of the stream; InvalidArgument for
// a device that is not a GPU of `rt`, or for a stream value below 1 (0 is
// ambiguous in DLPack, -1 names no stream). The wait cannot be cancelled.
//
// Thread safety: safe from any thread.
template <typename CompletionToken>
auto async_wait_for_stream(runtime& rt, device gpu, std::int64_t stream, CompletionToken&& token) {
  return asio::async_initiate<CompletionToken, void(absl::Status)>(
      [&rt, gpu, stream](auto handler) {
        detail::when_stream_reaches(rt, gpu, stream,
                                    detail::deliver_to<absl::Status>(std::move(handler), rt));
      },
      token);
}

template <typename CompletionToken>
auto gpu_stream::async_wait(CompletionToken&& token) {
  return async_wait_for_stream(*rt_, device_, dlpack_stream(),
                               std::forward<CompletionToken>(token));
}

}  // namespace dlasync
