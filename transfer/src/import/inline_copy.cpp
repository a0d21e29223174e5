// Small host copies done on the calling thread (detail::copy_inline).
#include "absl/container/inlined_vector.h"
#include "dlasync/import.hpp"
#include "runtime/src/runtime_core.hpp"
#include "transfer/src/copy/host_copy.hpp"
#include "transfer/src/copy/transfer_path.hpp"
#include "transfer/src/dlpack/tensor_factory.hpp"
#include "transfer/src/import/import_operation.hpp"
#include "transfer/src/import/import_start.hpp"
#include "transfer/src/validate/layout.hpp"

namespace dlasync::detail {

std::optional<import_result> copy_inline(runtime& rt, import_start& start) {
  runtime_core& core = core_of(rt);
  const import_plan& plan = start.plan;
  if (start.transfer.path != transfer_path::host_to_host ||
      plan.byte_size > core.options().inline_copy_bytes || plan.producer_stream != stream_no_sync) {
    return std::nullopt;
  }
  const std::shared_ptr<memory_budget>& budget = core.budget();
  const std::uint64_t bytes = plan.byte_size;
  if (!budget->try_acquire(bytes)) return std::nullopt;
  start.began = runtime_counters::timed_from(start.began);
  // Registered, so that a shutdown on another thread waits for the copy.
  const std::uint64_t op = core.begin_operation([] {});
  if (op == 0) {
    budget->release(bytes);
    import_result result(failed_after_taking(
        with_import_error(shut_down_before_copy(), {true, "shutdown", ""}), start.plan));
    count_completed(core, start.began, transfer_path::host_to_host, bytes, result);
    return result;
  }
  absl::StatusOr<device_buffer> allocated =
      core.backend_for(plan.target.kind)
          ->allocate(plan.target, bytes, plan.alignment, {plan.target, 0}, nullptr);
  if (!allocated.ok()) {
    budget->release(bytes);
    core.end_operation(op);
    return std::nullopt;
  }
  const DLTensor& dl = *start.source.dl_tensor();
  const strided_copy copy(start.transfer.layout);
  copy_here(copy_services_of(core), copy, first_element(plan), allocated->data());
  const absl::InlinedVector<std::int64_t, 8> shape(dl.shape, dl.shape + dl.ndim);
  device_buffer buffer = holding_budget(*std::move(allocated), bytes, budget);
  // Nothing reads the source any more.
  managed_tensor consumed = std::move(start.source);
  consumed.reset();
  core.end_operation(op);
  import_result result = tensor_factory::make_copy(std::move(buffer), plan, shape);
  count_completed(core, start.began, transfer_path::host_to_host, bytes, result);
  return result;
}

}  // namespace dlasync::detail
