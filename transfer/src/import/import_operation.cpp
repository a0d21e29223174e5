#include "transfer/src/import/import_operation.hpp"

#include <atomic>
#include <thread>

#include "dlasync/import.hpp"
#include "transfer/src/dlpack/tensor_factory.hpp"
#include "transfer/src/validate/layout.hpp"

namespace dlasync::detail {

absl::Status failed_after_taking(absl::Status status, const import_plan& plan) {
  import_error e = import_error_of(status).value_or(import_error{});
  e.consumed = true;
  e.copy_reasons = plan.copy_reason_names();
  return with_import_error(std::move(status), e);
}

device_buffer holding_budget(device_buffer memory, std::uint64_t bytes,
                             std::shared_ptr<memory_budget> budget) {
  const device on = memory.device();
  void* data = memory.data();
  return device_buffer(
      on, data, bytes,
      [memory = std::move(memory), budget = std::move(budget)](void*, std::uint64_t n) mutable {
        memory.reset();
        budget->release(n);
      });
}

copy_services copy_services_of(runtime_core& core) noexcept {
  copy_services with;
  with.workers = &core.workers();
  with.host = &core.host();
  if (cuda_backend* cuda = core.cuda(); cuda != nullptr) with.cuda = &cuda->context();
  with.cuda_api = core.cuda_api();
  with.parallel_copy_bytes = core.options().parallel_copy_bytes;
  with.worker_threads = core.options().worker_threads;
  with.unit_observer = &core.hooks().copy_unit_observer;
  return with;
}

void release_later(runtime_core& core, managed_tensor source) {
  if (source.empty()) return;
  // Without a deleter there is nothing to run: nothing is handed over, and
  // the struct, which its producer may free or reuse once the import has
  // completed, is not read again.
  const bool has_deleter = source.versioned() != nullptr ? source.versioned()->deleter != nullptr
                                                         : source.legacy()->deleter != nullptr;
  if (!has_deleter) return source.reset();
  core.releases().post([source = std::move(source)]() mutable { source.reset(); });
}

std::uint64_t acquire_budget(runtime_core& core, std::uint64_t bytes,
                             memory_budget::grant_fn granted) {
  const std::thread::id starter = std::this_thread::get_id();
  auto starting = std::make_shared<std::atomic<bool>>(true);
  const std::uint64_t ticket = core.budget()->acquire(
      bytes, [&core, starter, starting, granted = std::move(granted)](absl::Status s) mutable {
        if (starting->load(std::memory_order_acquire) && std::this_thread::get_id() == starter) {
          return std::move(granted)(std::move(s));
        }
        core.completions().run([granted = std::move(granted), s = std::move(s)]() mutable {
          std::move(granted)(std::move(s));
        });
      });
  starting->store(false, std::memory_order_release);
  return ticket;
}

void count_completed(runtime_core& core, runtime_counters::clock::time_point began,
                     transfer_path path, std::uint64_t bytes,
                     const import_result& result) noexcept {
  runtime_counters& counters = core.counters();
  if (!result.ok()) return counters.import_completed(began, import_outcome::failed);
  if (const std::optional<byte_path> moved = counted_path(path)) {
    counters.moved(*moved, bytes);
    return counters.import_completed(began, import_outcome::copy);
  }
  counters.import_completed(began, import_outcome::view);
}

absl::Status shutting_down() {
  return absl::UnavailableError(
      "the dlasync runtime is shutting down and accepts no new imports; the tensor was not "
      "consumed: import it on another runtime");
}

absl::Status shut_down_before_copy() {
  return absl::CancelledError(
      "the dlasync runtime began shutting down before the copy started; the source tensor was "
      "consumed and released");
}

void start(const std::shared_ptr<import_operation>& op,
           absl::AnyInvocable<void(import_result) &&> done) {
  op->start(std::move(done));
}

void cancel(import_operation& op) {
  op.cancel();
}

import_operation::import_operation(runtime_core& core, import_start started)
    : core_(core),
      source_(std::move(started.source)),
      plan_(started.plan),
      produced_(std::move(started.produced)),
      transfer_(std::move(started.transfer)),
      budget_wait_(*core.budget()),
      control_(std::make_shared<copy_control>()),
      budget_held_(started.budget_held),
      began_(runtime_counters::timed_from(started.began)) {
  const DLTensor& dl = *source_.dl_tensor();
  shape_.assign(dl.shape, dl.shape + dl.ndim);
}

void import_operation::start(done_fn done) {
  done_ = std::move(done);
  std::weak_ptr<import_operation> weak = weak_from_this();
  op_id_ = core_.begin_operation([weak] {
    if (std::shared_ptr<import_operation> self = weak.lock()) self->cancel();
  });
  if (op_id_ == 0) {
    if (budget_held_) core_.budget()->release(transfer_.hold_bytes);
    return finish(with_import_error(shut_down_before_copy(), {true, "shutdown", ""}));
  }
  if (transfer_.path == transfer_path::view_after_producer) return wait_for_producer();
  if (budget_held_) return on_budget(absl::OkStatus());
  // A cancel that came before (or comes while the ticket is not known) ends
  // the wait as soon as it is.
  budget_wait_.begin(
      transfer_.hold_bytes,
      [self = shared_from_this()](absl::Status s) { self->on_budget(std::move(s)); },
      [this](std::uint64_t bytes, memory_budget::grant_fn granted) {
        return acquire_budget(core_, bytes, std::move(granted));
      });
}

void import_operation::cancel() {
  control_->cancel_requested.store(true, std::memory_order_release);
  (void)budget_wait_.cancel(absl::CancelledError(
      "the import was cancelled while it waited for copy memory budget; the source tensor was "
      "released"));
}

void import_operation::wait_for_producer() {
  // A view of GPU (or pinned) memory still being written: hand it out when
  // the producer's stream has reached this point. Validation asks for the
  // CUDA backend whenever a producer stream is given.
  const marker_ptr produced =
      produced_ ? produced_ : done_marker(absl::InternalError("no producer point was recorded"));
  if (caller_stream_follows(produced)) {
    // The caller's stream follows the producer on the device: no wait here.
    return finish(tensor_factory::make_view(std::move(source_), plan_));
  }
  produced->on_complete([self = shared_from_this()](absl::Status s) {
    if (!s.ok()) return self->finish(std::move(s));
    if (self->control_->cancel_requested.load(std::memory_order_acquire)) {
      return self->finish(absl::CancelledError(
          "the import was cancelled while it waited for the producer's stream; the "
          "source tensor was released"));
    }
    self->finish(tensor_factory::make_view(std::move(self->source_), self->plan_));
  });
}

void import_operation::on_budget(absl::Status status) {
  budget_wait_.end();
  if (!status.ok()) return finish(std::move(status));
  const std::uint64_t bytes = transfer_.hold_bytes;
  std::shared_ptr<memory_budget> budget = core_.budget();
  if (control_->cancel_requested.load(std::memory_order_acquire)) {
    budget->release(bytes);
    return finish(absl::CancelledError(
        "the import was cancelled before its copy started; the source tensor was released"));
  }
  const stream_slot stream = core_.next_stream(transfer_.stream_device);
  // A GPU copy's memory is freed stream-ordered; the tensor may move that
  // free onto the caller's stream (tensor::set_stream).
  if (plan_.target.kind == device_kind::cuda) {
    free_stream_ = std::make_shared<std::atomic<std::int64_t>>(stream_no_sync);
  }
  absl::StatusOr<device_buffer> allocated =
      core_.backend_for(plan_.target.kind)
          ->allocate(plan_.target, bytes, plan_.alignment, stream, free_stream_);
  if (!allocated.ok()) {
    budget->release(bytes);
    return finish(allocated.status());
  }
  void* data = allocated->data();
  buffer_ = holding_budget(*std::move(allocated), bytes, std::move(budget));

  copy_request request;
  request.path = transfer_.path;
  request.source = plan_.source;
  request.target = plan_.target;
  request.from = first_element(plan_);
  request.to = data;
  request.layout = std::move(transfer_.layout);
  request.bytes = bytes;
  request.compact = plan_.compact;
  request.produced = produced_;
  request.control = control_;
  const marker_ptr copied = start_copy(copy_services_of(core_), stream, std::move(request));
  if (caller_stream_follows(copied)) {
    // The caller's stream follows the copy on the device: resume now, and
    // release the source when the copy has read it.
    import_result result =
        tensor_factory::make_copy(std::move(buffer_), plan_, shape_, free_stream_);
    count_completed(core_, began_, transfer_.path, bytes, result);
    std::move(done_)(std::move(result));
    after(copied, [self = shared_from_this()](const absl::Status&) {
      self->release_source();
      self->core_.end_operation(self->op_id_);
    });
    return;
  }
  after(copied, [self = shared_from_this()](absl::Status s) { self->on_copied(std::move(s)); });
}

void import_operation::after(const marker_ptr& m, completion_marker::callback fn) {
  std::optional<absl::Status> done = m->on_complete_unless_done(fn);
  if (!done) return;  // runs where the copy completes: a worker, or the reactor's hand-off
  // Done already (a worker finished the copy before this thread got here,
  // or it failed as it was enqueued): what follows, the hand-off of the
  // source among it, runs on a worker, not on the thread that starts the
  // import.
  if (core_.workers().running_in_this_thread()) return std::move(fn)(*std::move(done));
  core_.workers().post(
      [fn = std::move(fn), status = *std::move(done)]() mutable { std::move(fn)(status); });
}

bool import_operation::caller_stream_follows(const marker_ptr& m) {
  // A marker already done has nothing to order, and may carry an error (a
  // copy that failed as it was enqueued, a producer stream that could not
  // be followed): the caller must not resume early as if the work were
  // enqueued. A consumer stream is given for GPU targets only.
  return plan_.consumer_stream != stream_no_sync && !m->done() &&
         core_.cuda()->context().order_consumer(plan_.target, plan_.consumer_stream, m).ok();
}

void import_operation::release_source() {
  if (!source_) return;
  // The simulation checks that no device work of this import still reads
  // the bytes its strides reach (validation's span), when the import gives
  // them up: here, not on the releaser, whose deleter runs later still.
  if (cuda::api* api = core_.cuda_api(); api != nullptr && plan_.source.kind != device_kind::cpu) {
    api->host_access(static_cast<const char*>(first_element(plan_)) + plan_.span_begin,
                     static_cast<std::uint64_t>(plan_.span_end - plan_.span_begin),
                     cuda::host_use::release, "the DLPack deleter of the source runs",
                     control_->owner);
  }
  release_later(core_, std::move(source_));
}

void import_operation::on_copied(absl::Status status) {
  // Nothing reads the source any more.
  release_source();
  if (control_->aborted.load(std::memory_order_acquire)) {
    buffer_.reset();
    return finish(absl::CancelledError(
        "the import was cancelled during its copy; the partial copy was freed and the source "
        "tensor released"));
  }
  if (!status.ok()) {
    buffer_.reset();
    return finish(std::move(status));
  }
  finish(tensor_factory::make_copy(std::move(buffer_), plan_, shape_, free_stream_));
}

void import_operation::finish(import_result result) {
  release_source();
  if (!result.ok()) result = failed_after_taking(std::move(result).status(), plan_);
  count_completed(core_, began_, transfer_.path, transfer_.hold_bytes, result);
  std::move(done_)(std::move(result));
  if (op_id_ != 0) core_.end_operation(op_id_);
}

}  // namespace dlasync::detail
