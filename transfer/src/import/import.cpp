#include "dlasync/import.hpp"

#include <optional>

#include "absl/strings/str_cat.h"
#include "asio/use_awaitable.hpp"
#include "runtime/src/completion_marker.hpp"
#include "runtime/src/runtime_core.hpp"
#include "transfer/src/copy/transfer_path.hpp"
#include "transfer/src/dlpack/tensor_factory.hpp"
#include "transfer/src/import/import_operation.hpp"
#include "transfer/src/plan/transfer_plan.hpp"
#include "transfer/src/validate/layout.hpp"

namespace dlasync {
namespace detail {

import_start prepare_import(runtime& rt, managed_tensor& source, const import_options& options) {
  runtime_core& core = core_of(rt);
  import_start start;
  if (!core.accepting()) {
    start.ready = refused(shutting_down(), "shutdown");
    return start;
  }
  // Planned into the start itself: no plan is copied on the fast path.
  import_plan& plan = start.plan;
  if (absl::Status planned = plan_import_into(source, options, core.registry(), plan);
      !planned.ok()) {
    start.ready = refused(std::move(planned), "");
    return start;
  }
  transfer_facts facts;
  facts.budget_limit = core.budget()->limit();
  cuda_backend* cuda = core.cuda();
  // The query the plan's function reference names lives to the plan's end.
  const auto device_of = [cuda](const void* p) { return cuda->context().device_of(p); };
  if (cuda != nullptr) {
    facts.locate.emplace(device_of);
    facts.chunk_bytes = cuda->context().chunks().chunk_bytes();
  }
  if (absl::Status planned = plan_transfer(facts, plan, *source.dl_tensor(), start.transfer);
      !planned.ok()) {
    start.ready = std::move(planned);
  }
  return start;
}

void take_source(runtime& rt, import_start& start, managed_tensor& source) {
  if (start.ready) return;
  runtime_core& core = core_of(rt);
  const import_plan& plan = start.plan;
  if (start.transfer.path == transfer_path::view) {
    start.ready = tensor_factory::make_view(std::move(source), plan);
    return;
  }
  if (plan.producer_stream != stream_no_sync) {
    // The producer's point is the moment of this call, on this thread:
    // recorded here, not later on whichever thread runs the import.
    marker_ptr produced =
        core.cuda()->context().record_producer(producer_gpu(plan), plan.producer_stream);
    if (absl::Status st = failed_at_once(produced); !st.ok()) {
      start.ready = refused(
          absl::Status(st.code(),
                       absl::StrCat("cannot follow the producer's stream ", plan.producer_stream,
                                    ": ", st.message(),
                                    "; the tensor was not consumed: pass a stream of the tensor's "
                                    "device, or -1 after synchronizing the producer")),
          "producer_stream", &plan);
      return;
    }
    start.produced = std::move(produced);
  }
  start.source = std::move(source);
}

import_begun begin_import(runtime& rt, managed_tensor& source, const import_options& options) {
  import_start start = prepare_import(rt, source, options);
  take_source(rt, start, source);
  // A refusal or a view is handed on at once: it began and completed here.
  if (start.ready) {
    count_instant(core_of(rt), *start.ready);
    return {std::move(start.ready), nullptr};
  }
  core_of(rt).counters().import_began();
  if (std::optional<import_result> copied = copy_inline(rt, start)) {
    return {std::move(copied), nullptr};
  }
  return {std::nullopt, std::make_shared<import_operation>(core_of(rt), std::move(start))};
}

namespace {

// import_view's result for a prepared import that is not ready: the view,
// or why there can be none (the tensor then stays with `source`).
absl::StatusOr<tensor> view_at_once(managed_tensor& source, const import_start& start) {
  const import_plan& plan = start.plan;
  switch (start.transfer.path) {
    case transfer_path::view: return tensor_factory::make_view(std::move(source), plan);
    case transfer_path::view_after_producer:
      return refused(
          absl::FailedPreconditionError(absl::StrCat(
              "import_view hands the view out at once and cannot wait for the producer's "
              "stream ",
              plan.producer_stream,
              "; the tensor was not consumed: pass stream -1 after synchronizing the producer, "
              "or use import_dlpack, which orders the view after the stream on the device")),
          "producer_stream", &plan);
    default:
      return refused(
          absl::FailedPreconditionError(absl::StrCat(
              "a zero-copy view of this tensor is not possible: ", plan.copy_reason_text(),
              "; the tensor was not consumed: use import_dlpack, which copies")),
          "copy", &plan);
  }
}

// The initiation of an import begun already (the awaitable form validates
// and copies inline before it suspends).
struct initiate_started {
  runtime* rt;

  template <typename Handler>
  void operator()(Handler&& handler, std::shared_ptr<import_operation> op) const {
    launch<import_result>(std::forward<Handler>(handler), *rt, op);
  }
};

}  // namespace

}  // namespace detail

absl::StatusOr<tensor> import_view(runtime& rt, managed_tensor& source,
                                   const import_options& options) {
  detail::import_start start = detail::prepare_import(rt, source, options);
  absl::StatusOr<tensor> result =
      start.ready ? *std::move(start.ready) : detail::view_at_once(source, start);
  detail::count_instant(detail::core_of(rt), result);
  return result;
}

#if defined(ASIO_HAS_CO_AWAIT)
asio::awaitable<absl::StatusOr<tensor>> import_dlpack(runtime& rt, managed_tensor& source,
                                                      import_options options) {
  detail::import_begun begun = detail::begin_import(rt, source, options);
  if (begun.ready) co_return std::move(*begun.ready);
  co_return co_await asio::async_initiate<const asio::use_awaitable_t<>&,
                                          void(absl::StatusOr<tensor>)>(
      detail::initiate_started{&rt}, asio::use_awaitable, std::move(begun.op));
}

asio::awaitable<std::vector<absl::StatusOr<tensor>>> import_dlpack_batch(
    runtime& rt, std::span<managed_tensor> sources, import_options options) {
  co_return co_await async_import_dlpack_batch(rt, sources, options, asio::use_awaitable);
}
#endif

}  // namespace dlasync
