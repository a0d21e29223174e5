// dlasync/import.hpp
//
// Asynchronous DLPack imports. The contract, in order:
//
// Ownership. Every import validates the tensor first (plan_import, then
// where its memory lies and whether the copy fits the budget and the
// staging chunks) and takes it out of the caller's `managed_tensor` only
// when all of that passes: after the operation started, an empty handle
// means "consumed", a non-empty one means "refused, still yours". Every
// error carries an import_error payload (validate.hpp) saying which.
// Validation and consumption happen when the operation starts, for every
// completion token: at the call for callbacks and use_future, at launch for
// deferred (the default token), when awaited for use_awaitable. A consumed
// tensor's deleter runs exactly once: for a view, when the last reference to
// the imported tensor goes; for a copy, once the copy has finished reading
// it, also on error, cancellation and runtime shutdown. A copy's deleter may
// run after its result is delivered (a small host copy done inline runs it
// before the import returns), and has run when shutdown returns: the DLPack
// struct and what its deleter uses must stay valid until it runs.
//
// Where things run. The CUDA reactor thread only polls events and hands
// off. A copy's source deleter runs on the runtime's releaser, one thread
// of its own that runs deleters in the order they come, so that a deleter
// that blocks delays no import; a small host copy done inline runs its
// deleter on the calling thread; a view's deleter runs where its last
// reference goes. Budget grants, the start of a waiting import and the
// continuations of GPU work run on the runtime's workers (its own threads,
// or runtime_options::worker_executor). Handlers run on their associated
// executor, or the runtime's (runtime::get_executor) when they have none.
// docs/import.md has the table.
//
// Stream ordering. Host memory has no streams: `options.stream` must be
// none (stream_no_sync). The copy is enqueued on one of the in-order
// streams of the device that carries it (the target, or the source GPU for
// a download); a CUDA producer's stream is followed on the device, without
// blocking a thread. A GPU copy is freed stream-ordered on its stream
// (tensor::stream, tensor::set_stream).
//
// Completion. A view needs no work: the awaitable form returns it without
// suspending. Neither does a host-to-host copy of at most
// runtime_options::inline_copy_bytes when the copy budget has room at once:
// it is copied on the calling thread at initiation (idle workers helping
// from runtime_options::parallel_copy_bytes up), and cannot be cancelled. Otherwise the result
// arrives when the copy is complete. A handler is called exactly once,
// never from inside the initiating function. Completion signature:
// void(absl::StatusOr<dlasync::tensor>).
//
// Cancellation. Per-operation cancellation through the handler's
// cancellation slot. Terminal and partial cancellation stop the import
// (Cancelled): it frees what it allocated and releases the source once
// nothing reads it, a partial side effect. Total cancellation, which asks
// for no side effect, cannot be honoured once the source is consumed, and
// is ignored. Cancelling after completion has no effect.
//
// Thread safety. Imports may be started from any thread, concurrently, on
// one runtime. A `managed_tensor` handle is not shared between threads.
//
// Errors (import_error says consumed or not, and the rule). Not consumed:
// the validation codes as plan_import documents, FailedPrecondition for
// memory that is not where the tensor says, ResourceExhausted for a copy
// larger than the whole budget, Unimplemented for a strided row larger
// than a staging chunk, Unavailable when the runtime is shutting down.
// Consumed: Cancelled (also when shutdown cut the import off),
// ResourceExhausted when memory runs out, and the errors of CUDA calls. The
// message names the value seen and the way out.
//
// Example, a request handler:
//
//   asio::awaitable<void> handle(dlasync::runtime& rt, DLManagedTensorVersioned* in) {
//     dlasync::managed_tensor source(in);
//     dlasync::import_options options;
//     options.require_contiguous = true;
//     absl::StatusOr<dlasync::tensor> t = co_await dlasync::import_dlpack(rt, source, options);
//     if (!t.ok()) co_return reply_error(t.status());
//     co_return reply(sum(*t));
//   }
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "asio/async_result.hpp"
#include "asio/awaitable.hpp"
#include "dlasync/detail/import_initiation.hpp"
#include "dlasync/device_registry.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/dtype.hpp"
#include "dlasync/import_options.hpp"
#include "dlasync/runtime.hpp"
#include "dlasync/tensor.hpp"
#include "dlasync/validate.hpp"

namespace dlasync {

// A zero-copy view, synchronously, with the promises of import_dlpack: the
// runtime must be accepting (Unavailable otherwise), the CUDA runtime
// confirms that GPU, managed or pinned memory lies where the tensor says
// (FailedPrecondition otherwise), and no producer stream may be given: a
// view handed out at once cannot follow one (FailedPrecondition: pass -1
// after synchronizing the producer, or use import_dlpack, which waits on the
// device). When a copy would be needed it fails with FailedPrecondition
// naming why. On every error `source` keeps the tensor.
[[nodiscard]] absl::StatusOr<tensor> import_view(runtime& rt, managed_tensor& source,
                                                 const import_options& options = {});

#if defined(ASIO_HAS_CO_AWAIT)
// Imports `source` onto `options.target`. `source` must stay alive until the
// awaitable completes. Validation and consumption happen when it is awaited.
// A zero-copy import completes without suspending.
// (The awaitable forms exist where Asio supports co_await, as with g++ 12;
// the completion-token forms below work with every C++20 compiler.)
[[nodiscard]] asio::awaitable<absl::StatusOr<tensor>> import_dlpack(runtime& rt,
                                                                    managed_tensor& source,
                                                                    import_options options = {});
#endif

// The same as an Asio initiating function, completion signature
// void(absl::StatusOr<dlasync::tensor>). Validation and consumption happen
// when the operation starts: at the call for a callback or use_future, at
// launch for deferred (a deferred operation never launched leaves `source`
// untouched), when awaited for use_awaitable. `source` must stay alive until
// then. The default token is deferred (or the executor's own default).
template <ASIO_COMPLETION_TOKEN_FOR(void(absl::StatusOr<tensor>))
              CompletionToken = detail::default_token_t<runtime::executor_type>>
auto async_import_dlpack(runtime& rt, managed_tensor& source, const import_options& options = {},
                         CompletionToken&& token = CompletionToken()) {
  return asio::async_initiate<CompletionToken, void(absl::StatusOr<tensor>)>(
      detail::initiate_import{&rt}, token, &source, options);
}

// Imports every tensor of `sources` with the same options, and completes
// when all are done with one result per tensor, in order. The batch is
// validated as a whole when it starts: when its copies together exceed the
// whole copy budget, every member is refused with ResourceExhausted and
// nothing is consumed. Otherwise each handle follows the ownership rule on
// its own, and the copies' budget is reserved for all members at once, so
// that members never wait for one another. Cancelling the batch cancels
// every member still running. `sources` must stay alive until it starts.
#if defined(ASIO_HAS_CO_AWAIT)
[[nodiscard]] asio::awaitable<std::vector<absl::StatusOr<tensor>>> import_dlpack_batch(
    runtime& rt, std::span<managed_tensor> sources, import_options options = {});
#endif

// Completion signature: void(std::vector<absl::StatusOr<dlasync::tensor>>).
template <ASIO_COMPLETION_TOKEN_FOR(void(std::vector<absl::StatusOr<tensor>>))
              CompletionToken = detail::default_token_t<runtime::executor_type>>
auto async_import_dlpack_batch(runtime& rt, std::span<managed_tensor> sources,
                               const import_options& options = {},
                               CompletionToken&& token = CompletionToken()) {
  return asio::async_initiate<CompletionToken, void(std::vector<absl::StatusOr<tensor>>)>(
      detail::initiate_batch{&rt}, token, sources, options);
}

// Imports `source` as a zero-copy view of host memory when `options` allow
// one: validates and plans (plan_import), then takes `source` only on
// success. When a copy would be needed it fails with FailedPrecondition
// naming why, and `source` keeps the tensor; the asynchronous import makes
// copies. GPU, managed and pinned memory are refused here (FailedPrecondition):
// only a runtime can confirm where they lie; use the runtime's import_view
// (below).
absl::StatusOr<tensor> import_view(managed_tensor& source, const import_options& options,
                                   const device_registry& registry);

}  // namespace dlasync
