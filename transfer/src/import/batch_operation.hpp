// A batch of imports (internal). When it starts, every member is validated
// without consuming anything; when the copies together exceed the whole
// copy budget, the batch is refused (ResourceExhausted, nothing consumed).
// Otherwise the members are taken, the copies' budget is reserved for all
// at once (so that members never wait for one another), and each member
// then runs on its own. The batch completes once, when all members have,
// with one result per member in order. Cancelling the batch cancels every
// member still running, or ends its wait for budget.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "dlasync/detail/import_initiation.hpp"
#include "transfer/src/import/import_operation.hpp"

namespace dlasync::detail {

class batch_operation : public std::enable_shared_from_this<batch_operation> {
 public:
  using done_fn = absl::AnyInvocable<void(batch_result) &&>;

  explicit batch_operation(runtime& rt);

  // A cancel that comes before start cancels every member as it starts.
  void start(done_fn done, std::span<managed_tensor> sources, const import_options& options);
  void cancel();

 private:
  bool needs_budget(const import_start& m) const;
  void on_budget(absl::Status status);
  void start_member(std::size_t index);
  // A member that ended without running as an import_operation (refused,
  // a view, or failed waiting for budget): counted (runtime::stats), done.
  void member_ended(std::size_t index, import_result result);
  void member_done(std::size_t index, import_result result);
  void arrive();

  runtime& rt_;
  runtime_core& core_;
  std::vector<import_start> members_;
  batch_result results_;
  std::atomic<std::size_t> remaining_{0};
  done_fn done_;             // set by start
  std::uint64_t op_id_ = 0;  // registered while it waits for budget
  budget_wait budget_wait_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<import_operation>> ops_;
  bool cancelled_ = false;
};

}  // namespace dlasync::detail
