#include "transfer/src/import/batch_operation.hpp"

namespace dlasync::detail {

std::shared_ptr<batch_operation> make_batch(std::size_t size,
                                            absl::AnyInvocable<void(batch_result) &&> done) {
  return std::make_shared<batch_operation>(size, std::move(done));
}

void start(const std::shared_ptr<batch_operation>& op, runtime& rt,
           std::vector<import_start> members) {
  op->start(rt, std::move(members));
}

void cancel(batch_operation& op) {
  op.cancel();
}

batch_operation::batch_operation(std::size_t size, done_fn done)
    : results_(size, absl::UnknownError("not imported")), done_(std::move(done)) {}

void batch_operation::start(runtime& rt, std::vector<import_start> members) {
  // One extra count keeps the batch from completing while members start.
  remaining_.store(members.size() + 1, std::memory_order_relaxed);
  for (std::size_t i = 0; i < members.size(); ++i) {
    import_start& m = members[i];
    if (!m.ready) m.ready = copy_inline(rt, m);
    if (m.ready) {
      member_done(i, std::move(*m.ready));
      continue;
    }
    auto op = std::make_shared<import_operation>(
        core_of(rt), std::move(m),
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

void batch_operation::cancel() {
  std::vector<std::shared_ptr<import_operation>> ops;
  {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    ops = ops_;
  }
  for (const std::shared_ptr<import_operation>& op : ops) op->cancel();
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
