// Small host copies done on the calling thread (detail::copy_inline).
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
  // Counted, so that a shutdown on another thread waits for the copy.
  if (!core.begin_inline()) {
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
    core.end_inline();
    return std::nullopt;
  }
  const strided_copy copy(start.transfer.layout);
  copy_here(copy_services_of(core), copy, first_element(plan), allocated->data());
  const DLTensor& dl = *start.source.dl_tensor();
  // The tensor gives the budget back after its buffer (make_copy), which
  // takes it last: nothing can throw after that.
  import_result result = [&]() -> import_result {
    try {
      return tensor_factory::make_copy(*std::move(allocated), plan,
                                       {dl.shape, static_cast<std::size_t>(dl.ndim)}, nullptr,
                                       budget);
    } catch (...) {
      budget->release(bytes);
      core.end_inline();
      throw;
    }
  }();
  // Nothing reads the source any more. Its deleter runs before the copy
  // counts as ended, so that shutdown returns after it (runtime.hpp).
  managed_tensor consumed = std::move(start.source);
  consumed.reset();
  core.end_inline();
  count_completed(core, start.began, transfer_path::host_to_host, bytes, result);
  return result;
}

}  // namespace dlasync::detail
