#include "dlasync/transfer/import.hpp"

#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "dlasync/runtime/strided_copy.hpp"

namespace dlasync {
namespace detail {
namespace {

// How the copy reads the source: its elements as `strided_copy` sees them.
strided_layout source_layout(const DLTensor& dl, const import_plan& plan) {
  strided_layout layout;
  if (plan.type.is_sub_byte()) {  // packed and compact: plain bytes
    layout.element_size = 1;
    layout.shape.push_back(static_cast<std::int64_t>(plan.byte_size));
    layout.strides.push_back(1);
    return layout;
  }
  layout.element_size = plan.type.bits / 8u;
  layout.shape.assign(dl.shape, dl.shape + dl.ndim);
  layout.strides.resize(layout.shape.size());
  // Row-major strides for NULL ones. Validation bounds the product for
  // tensors with elements; a size-0 tensor may have huge other extents, and
  // copies nothing, so its strides saturate instead of overflowing.
  std::int64_t stride = 1;
  for (std::int32_t i = dl.ndim - 1; i >= 0; --i) {
    layout.strides[i] = dl.strides != nullptr ? dl.strides[i] : stride;
    if (__builtin_mul_overflow(stride, std::max<std::int64_t>(layout.shape[i], 1), &stride)) {
      stride = std::numeric_limits<std::int64_t>::max();
    }
  }
  return layout;
}

absl::Status shutting_down() {
  return absl::UnavailableError(
      "the dlasync runtime is shutting down and accepts no new imports; the tensor was not "
      "consumed: import it on another runtime");
}

// Shutdown began between the call and the start of the copy: the tensor
// was already consumed.
absl::Status shut_down_before_copy() {
  return absl::UnavailableError(
      "the dlasync runtime began shutting down before the copy started; the source tensor was "
      "released: import it on another runtime");
}

}  // namespace

import_start begin_import(runtime& rt, managed_tensor& source, const import_options& options) {
  import_start start;
  if (!rt.accepting()) {
    start.ready = shutting_down();
    return start;
  }
  absl::StatusOr<import_plan> plan = plan_import(source, options, rt.registry());
  if (plan.ok() && plan->element_count > 0) {
    // Where the data really is, when a backend can tell (GPU pointers).
    if (absl::Status where =
            rt.check_location(reinterpret_cast<const void*>(plan->address), plan->source);
        !where.ok()) {
      plan = where;
    }
  }
  if (!plan.ok()) {
    start.ready = plan.status();
  } else if (!plan->needs_copy() && !plan->needs_wait()) {
    start.ready = tensor::make_view(std::move(source), *plan);
  } else {
    start.plan = *plan;
    start.source = std::move(source);
  }
  return start;
}

namespace {

bool host_memory(device d) {
  return d.kind == device_kind::cpu || d.kind == device_kind::cuda_host;
}

}  // namespace

std::optional<import_result> copy_inline(runtime& rt, managed_tensor& source,
                                         const import_plan& plan) {
  if (plan.byte_size > rt.options().inline_copy_bytes || plan.target.kind != device_kind::cpu ||
      !host_memory(plan.source) || plan.producer_stream != -1 || plan.consumer_stream != -1) {
    return std::nullopt;
  }
  const std::shared_ptr<memory_budget>& budget = rt.copy_budget_ptr();
  const std::uint64_t bytes = plan.byte_size;
  if (!budget->try_acquire(bytes)) return std::nullopt;
  // Registered, so that a shutdown on another thread waits for the copy.
  const std::uint64_t op = rt.begin_operation([] {});
  if (op == 0) {
    budget->release(bytes);
    return import_result(shut_down_before_copy());
  }
  absl::StatusOr<device_buffer> allocated =
      rt.backend_for(plan.target).allocate(plan.target, bytes, plan.alignment, {plan.target, 0});
  if (!allocated.ok()) {
    budget->release(bytes);
    rt.end_operation(op);
    return std::nullopt;
  }
  const DLTensor& dl = *source.dl_tensor();
  const strided_copy copy(source_layout(dl, plan));
  copy.run(reinterpret_cast<const void*>(plan.address), allocated->data(), 0, copy.units());
  const absl::InlinedVector<std::int64_t, 8> shape(dl.shape, dl.shape + dl.ndim);
  void* data = allocated->data();
  device_buffer buffer(plan.target, data, bytes,
                       [memory = *std::move(allocated), budget](void*, std::uint64_t n) mutable {
                         memory.reset();
                         budget->release(n);
                       });
  // Nothing reads the source any more.
  managed_tensor consumed = std::move(source);
  consumed.reset();
  rt.end_operation(op);
  return tensor::make_copy(std::move(buffer), plan, shape);
}

std::vector<import_start> begin_batch(runtime& rt, std::span<managed_tensor> sources,
                                      const import_options& options) {
  std::vector<import_start> members;
  members.reserve(sources.size());
  for (managed_tensor& source : sources) members.push_back(begin_import(rt, source, options));
  return members;
}

copy_import::copy_import(runtime& rt, managed_tensor source, const import_plan& plan, done_fn done)
    : rt_(rt),
      source_(std::move(source)),
      plan_(plan),
      done_(std::move(done)),
      control_(std::make_shared<copy_control>()) {
  const DLTensor& dl = *source_.dl_tensor();
  shape_.assign(dl.shape, dl.shape + dl.ndim);
}

void copy_import::start() {
  std::weak_ptr<copy_import> weak = weak_from_this();
  op_id_ = rt_.begin_operation([weak] {
    if (std::shared_ptr<copy_import> self = weak.lock()) self->cancel();
  });
  if (op_id_ == 0) return finish(shut_down_before_copy());
  if (!plan_.needs_copy()) {
    // A view of GPU memory still being written: hand it out when the
    // producer's stream has reached this point.
    const marker_ptr produced =
        rt_.stream_backend(plan_.source).record_producer(plan_.source, plan_.producer_stream);
    // A marker already done has nothing to order, and may carry an error
    // (a producer stream that could not be followed): report it instead.
    if (plan_.consumer_stream != -1 && !produced->done() &&
        rt_.backend_for(plan_.target)
            .order_consumer(plan_.target, plan_.consumer_stream, produced)
            .ok()) {
      // The caller's stream follows the producer on the device: no wait here.
      return finish(tensor::make_view(std::move(source_), plan_));
    }
    produced->on_complete([self = shared_from_this()](absl::Status s) {
      if (!s.ok()) return self->finish(std::move(s));
      if (self->control_->cancel_requested.load(std::memory_order_acquire)) {
        return self->finish(absl::CancelledError(
            "the import was cancelled while it waited for the producer's stream; the "
            "source tensor was released"));
      }
      self->finish(tensor::make_view(std::move(self->source_), self->plan_));
    });
    return;
  }
  {
    std::lock_guard lock(mutex_);
    waiting_for_budget_ = true;
  }
  const std::uint64_t ticket = rt_.copy_budget().acquire(
      plan_.byte_size, [self = shared_from_this()](absl::Status s) { self->on_budget(s); });
  {
    std::lock_guard lock(mutex_);
    if (!waiting_for_budget_) return;
    ticket_ = ticket;
  }
  // A cancel that came before the ticket was known could not end the wait.
  if (control_->cancel_requested.load(std::memory_order_acquire)) cancel();
}

void copy_import::cancel() {
  control_->cancel_requested.store(true, std::memory_order_release);
  std::uint64_t ticket = 0;
  {
    std::lock_guard lock(mutex_);
    if (waiting_for_budget_) ticket = ticket_;
  }
  if (ticket != 0) {
    rt_.copy_budget().cancel(
        ticket, absl::CancelledError("the import was cancelled while it waited for copy memory "
                                     "budget; the source tensor was released"));
  }
}

void copy_import::on_budget(absl::Status status) {
  {
    std::lock_guard lock(mutex_);
    waiting_for_budget_ = false;
  }
  if (!status.ok()) return finish(std::move(status));
  const std::uint64_t bytes = plan_.byte_size;
  std::shared_ptr<memory_budget> budget = rt_.copy_budget_ptr();
  if (control_->cancel_requested.load(std::memory_order_acquire)) {
    budget->release(bytes);
    return finish(absl::CancelledError(
        "the import was cancelled before its copy started; the source tensor was released"));
  }
  backend& target = rt_.backend_for(plan_.target);
  backend& copier = rt_.copy_backend(plan_.source, plan_.target);
  const stream_ref stream = rt_.next_stream(runtime::copy_device(plan_.source, plan_.target));
  absl::StatusOr<device_buffer> allocated =
      target.allocate(plan_.target, bytes, plan_.alignment, stream);
  if (!allocated.ok()) {
    budget->release(bytes);
    return finish(allocated.status());
  }
  // The copy's memory counts against the budget until the tensor lets go.
  void* data = allocated->data();
  buffer_ = device_buffer(plan_.target, data, bytes,
                          [memory = *std::move(allocated), budget](void*, std::uint64_t n) mutable {
                            memory.reset();
                            budget->release(n);
                          });

  copy_job job;
  job.source_device = plan_.source;
  job.target_device = plan_.target;
  job.source = reinterpret_cast<const void*>(plan_.address);
  job.destination = data;
  job.layout = source_layout(*source_.dl_tensor(), plan_);
  job.producer_stream = plan_.producer_stream;
  job.control = control_;
  backend& follower = rt_.stream_backend(plan_.source);
  if (plan_.producer_stream != -1 && &copier != &follower) {
    // A copier that cannot follow the producer's stream (the host backend
    // copying out of pinned memory) starts when the stream reaches this point.
    job.producer_stream = no_producer_stream;
    follower.record_producer(plan_.source, plan_.producer_stream)
        ->on_complete(
            [self = shared_from_this(), stream, job = std::move(job)](absl::Status s) mutable {
              if (!s.ok()) {
                self->buffer_.reset();
                return self->finish(std::move(s));
              }
              self->enqueue(stream, std::move(job));
            });
    return;
  }
  enqueue(stream, std::move(job));
}

void copy_import::enqueue(stream_ref stream, copy_job job) {
  const marker_ptr copied =
      rt_.copy_backend(plan_.source, plan_.target).enqueue_copy(stream, std::move(job));
  // A copy that failed as it was enqueued completes its marker at once:
  // it must not resume the caller early as if it had been enqueued.
  if (plan_.consumer_stream != -1 && !copied->done() &&
      rt_.backend_for(plan_.target)
          .order_consumer(plan_.target, plan_.consumer_stream, copied)
          .ok()) {
    // The caller's stream follows the copy on the device: resume now, and
    // release the source when the copy has read it.
    std::move(done_)(tensor::make_copy(std::move(buffer_), plan_, shape_));
    copied->on_complete([self = shared_from_this()](absl::Status) {
      self->source_.reset();
      self->rt_.end_operation(self->op_id_);
    });
    return;
  }
  copied->on_complete(
      [self = shared_from_this()](absl::Status s) { self->on_copied(std::move(s)); });
}

void copy_import::on_copied(absl::Status status) {
  // Nothing reads the source any more.
  source_.reset();
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
  finish(tensor::make_copy(std::move(buffer_), plan_, shape_));
}

void copy_import::finish(import_result result) {
  source_.reset();
  std::move(done_)(std::move(result));
  if (op_id_ != 0) rt_.end_operation(op_id_);
}

batch_import::batch_import(std::size_t size, done_fn done)
    : results_(size, absl::UnknownError("not imported")), done_(std::move(done)) {}

void batch_import::start(runtime& rt, std::vector<import_start> members) {
  // One extra count keeps the batch from completing while members start.
  remaining_.store(members.size() + 1, std::memory_order_relaxed);
  for (std::size_t i = 0; i < members.size(); ++i) {
    import_start& m = members[i];
    if (!m.ready) m.ready = copy_inline(rt, m.source, m.plan);
    if (m.ready) {
      member_done(i, std::move(*m.ready));
      continue;
    }
    auto op = std::make_shared<copy_import>(
        rt, std::move(m.source), m.plan,
        [self = shared_from_this(), i](import_result r) { self->member_done(i, std::move(r)); });
    bool cancelled = false;
    {
      std::lock_guard lock(mutex_);
      ops_.push_back(op);
      cancelled = cancelled_;
    }
    if (cancelled) op->cancel();
    op->start();
  }
  arrive();
}

void batch_import::cancel() {
  std::vector<std::shared_ptr<copy_import>> ops;
  {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    ops = ops_;
  }
  for (const std::shared_ptr<copy_import>& op : ops) op->cancel();
}

void batch_import::member_done(std::size_t index, import_result result) {
  results_[index] = std::move(result);
  arrive();
}

void batch_import::arrive() {
  if (remaining_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  {
    std::lock_guard lock(mutex_);
    ops_.clear();  // the members hold the batch; drop the cycle
  }
  std::move(done_)(std::move(results_));
}

}  // namespace detail

#if defined(ASIO_HAS_CO_AWAIT)
asio::awaitable<absl::StatusOr<tensor>> import_dlpack(runtime& rt, managed_tensor& source,
                                                      import_options options) {
  detail::import_start start = detail::begin_import(rt, source, options);
  if (start.ready) co_return std::move(*start.ready);
  if (std::optional<detail::import_result> copied =
          detail::copy_inline(rt, start.source, start.plan)) {
    co_return *std::move(copied);
  }
  co_return co_await asio::async_initiate<const asio::use_awaitable_t<>&,
                                          void(absl::StatusOr<tensor>)>(
      detail::initiate_import{&rt}, asio::use_awaitable, std::move(start));
}

asio::awaitable<std::vector<absl::StatusOr<tensor>>> import_dlpack_batch(
    runtime& rt, std::span<managed_tensor> sources, import_options options) {
  co_return co_await async_import_dlpack_batch(rt, sources, options, asio::use_awaitable);
}
#endif

}  // namespace dlasync
