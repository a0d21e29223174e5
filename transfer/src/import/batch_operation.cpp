#include "transfer/src/import/batch_operation.hpp"

#include <limits>

#include "absl/strings/str_cat.h"
#include "transfer/src/copy/transfer_path.hpp"

namespace dlasync::detail {

std::shared_ptr<batch_operation> make_batch(runtime& rt) {
  return std::make_shared<batch_operation>(rt);
}

void start(const std::shared_ptr<batch_operation>& op,
           absl::AnyInvocable<void(batch_result) &&> done, std::span<managed_tensor> sources,
           const import_options& options) {
  op->start(std::move(done), sources, options);
}

void cancel(batch_operation& op) {
  op.cancel();
}

batch_operation::batch_operation(runtime& rt)
    : rt_(rt), core_(core_of(rt)), budget_wait_(*core_.budget()) {}

bool batch_operation::needs_budget(const import_start& m) const {
  return !m.ready && m.transfer.path != transfer_path::view &&
         m.transfer.path != transfer_path::view_after_producer;
}

void batch_operation::start(done_fn done, std::span<managed_tensor> sources,
                            const import_options& options) {
  done_ = std::move(done);
  const std::size_t n = sources.size();
  results_.assign(n, absl::UnknownError("not imported"));
  // One extra count keeps the batch from completing while members start.
  remaining_.store(n + 1, std::memory_order_relaxed);
  members_.reserve(n);
  // Every member is validated before any is taken.
  std::uint64_t total = 0;
  for (managed_tensor& source : sources) {
    members_.push_back(prepare_import(rt_, source, options));
    core_.counters().import_began();
    const import_start& m = members_.back();
    if (!needs_budget(m)) continue;
    total = m.transfer.hold_bytes > std::numeric_limits<std::uint64_t>::max() - total
                ? std::numeric_limits<std::uint64_t>::max()
                : total + m.transfer.hold_bytes;
  }
  const absl::Status over = check_budget(absl::StrCat("this batch of ", n, " tensors"), total,
                                         core_.budget()->limit(), "import them in smaller batches");
  if (!over.ok()) {
    for (std::size_t i = 0; i < n; ++i) {
      if (!members_[i].ready) members_[i].ready = refused(over, "budget", &members_[i].plan);
    }
  }
  // Registered, so that shutdown ends the wait for budget.
  if (total > 0 && over.ok()) {
    std::weak_ptr<batch_operation> weak = weak_from_this();
    op_id_ = core_.begin_operation([weak] {
      if (std::shared_ptr<batch_operation> self = weak.lock()) self->cancel();
    });
    if (op_id_ == 0) {
      for (import_start& m : members_) {
        if (!m.ready) m.ready = refused(shutting_down(), "shutdown");
      }
    }
  }
  // Now the members are taken: views at once, the others with their plan.
  for (std::size_t i = 0; i < n; ++i) {
    take_source(rt_, members_[i], sources[i]);
    if (members_[i].ready) {
      member_ended(i, std::move(*members_[i].ready));
    } else if (!needs_budget(members_[i])) {
      start_member(i);  // a view that waits for its producer's stream
    }
  }
  std::uint64_t reserved = 0;
  for (const import_start& m : members_) {
    if (needs_budget(m)) reserved += m.transfer.hold_bytes;
  }
  if (reserved == 0) {
    if (op_id_ != 0) core_.end_operation(op_id_);
    op_id_ = 0;
    return arrive();
  }
  // One reservation for all the copies (a producer stream that could not
  // be recorded has made its member ready, and left the total smaller). A
  // cancel that came before ends the wait as soon as its ticket is known.
  budget_wait_.begin(
      reserved, [self = shared_from_this()](absl::Status s) { self->on_budget(std::move(s)); },
      [this](std::uint64_t bytes, memory_budget::grant_fn granted) {
        return acquire_budget(core_, bytes, std::move(granted));
      });
}

void batch_operation::on_budget(absl::Status status) {
  budget_wait_.end();
  bool cancelled = false;
  {
    std::lock_guard lock(mutex_);
    cancelled = cancelled_;
  }
  if (status.ok() && cancelled) {
    status = absl::CancelledError(
        "the batch was cancelled before its copies started; its sources were released");
    for (const import_start& m : members_) {
      if (needs_budget(m)) core_.budget()->release(m.transfer.hold_bytes);
    }
  }
  for (std::size_t i = 0; i < members_.size(); ++i) {
    import_start& m = members_[i];
    if (!needs_budget(m)) continue;
    if (!status.ok()) {
      release_later(core_, std::move(m.source));  // consumed: nothing reads it yet
      const absl::Status failed = failed_after_taking(status, m.plan);
      m.ready = failed;
      member_ended(i, failed);
      continue;
    }
    m.budget_held = true;
    start_member(i);
  }
  const std::uint64_t id = op_id_;
  arrive();
  if (id != 0) core_.end_operation(id);
}

void batch_operation::start_member(std::size_t index) {
  auto op = std::make_shared<import_operation>(core_, std::move(members_[index]));
  members_[index].ready = absl::UnknownError("started");  // taken; no longer needs budget
  bool cancelled = false;
  {
    std::lock_guard lock(mutex_);
    ops_.push_back(op);
    cancelled = cancelled_;
  }
  if (cancelled) op->cancel();
  op->start([self = shared_from_this(), index](import_result r) {
    self->member_done(index, std::move(r));
  });
}

void batch_operation::cancel() {
  std::vector<std::shared_ptr<import_operation>> ops;
  {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    ops = ops_;
  }
  (void)budget_wait_.cancel(absl::CancelledError(
      "the batch was cancelled while it waited for copy memory budget; its sources were "
      "released"));
  for (const std::shared_ptr<import_operation>& op : ops) op->cancel();
}

void batch_operation::member_ended(std::size_t index, import_result result) {
  const import_start& m = members_[index];
  count_completed(core_, m.began, m.transfer.path, m.transfer.hold_bytes, result);
  member_done(index, std::move(result));
}

void batch_operation::member_done(std::size_t index, import_result result) {
  results_[index] = std::move(result);
  arrive();
}

void batch_operation::arrive() {
  if (remaining_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  {
    std::lock_guard lock(mutex_);
    ops_.clear();  // the members hold the batch; drop the cycle
  }
  std::move(done_)(std::move(results_));
}

}  // namespace dlasync::detail
