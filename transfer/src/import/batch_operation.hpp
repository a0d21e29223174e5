// A batch of imports (internal): each member validated at the call and
// started on its own; the batch completes once, when all members have, with
// one result per member in order. Cancelling the batch cancels every member
// still running.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "dlasync/transfer/detail/import_initiation.hpp"
#include "transfer/src/import/import_operation.hpp"

namespace dlasync::detail {

class batch_operation : public std::enable_shared_from_this<batch_operation> {
 public:
  using done_fn = absl::AnyInvocable<void(batch_result) &&>;

  batch_operation(std::size_t size, done_fn done);

  void start(runtime& rt, std::vector<import_start> members);
  void cancel();

 private:
  void member_done(std::size_t index, import_result result);
  void arrive();

  batch_result results_;
  std::atomic<std::size_t> remaining_{0};
  done_fn done_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<import_operation>> ops_;
  bool cancelled_ = false;
};

}  // namespace dlasync::detail
