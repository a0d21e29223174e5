// A remote import's end: the fetched bytes of each member become a tensor
// (a compact copy on a CPU as they are, the others through a local import:
// the staging pipeline to a GPU, the copy kernels for a span), and the
// handler gets all of them once the last has landed.
#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asio/post.hpp"
#include "dlasync/import.hpp"
#include "dlasync/producer.hpp"
#include "remote/src/remote_core.hpp"
#include "remote/src/remote_import.hpp"
#include "runtime/src/runtime_core.hpp"
#include "transfer/src/dlpack/tensor_factory.hpp"

namespace dlasync::detail {

device_buffer remote_import::owned_locked(member& m) {
  std::shared_ptr<memory_budget> budget = core_of(core_->rt()).budget();
  const std::uint64_t held = std::min(m.fetch_bytes, budget_held_);
  budget_held_ -= held;
  void* data = m.buffer.data();
  return device_buffer(host_, data, m.fetch_bytes,
                       [inner = std::move(m.buffer), budget, held](void*, std::uint64_t) mutable {
                         inner.reset();
                         if (held != 0) budget->release(held);
                       });
}

void remote_import::fetched_locked() {
  untrack_locked();
  release_hold_locked();
  if (std::chrono::steady_clock::now() > hold_end_) {
    return fail_locked(absl::DeadlineExceededError(
        absl::StrCat("lease ", lease_id_,
                     " ended while its bytes were moving, so they may have been released under the "
                     "transfer; publish with a longer publish_options::lease")));
  }
  keys_.clear();  // the cache keeps those it holds
  if (timeout_) timeout_->cancel();
  // Each member's fetched bytes, owned by a buffer that returns their
  // budget: compact ones on a CPU are the result as they are; the others
  // land by a local import.
  landed_.resize(members_.size());
  std::vector<std::pair<std::size_t, device_buffer>> to_land;
  for (std::size_t k = 0; k < members_.size(); ++k) {
    member& m = members_[k];
    device_buffer owned = owned_locked(m);
    if (m.lands == layout::compact && options_.target->kind == device_kind::cpu) {
      absl::StatusOr<tensor> t =
          tensor_factory::make_copy(std::move(owned), m.plan.plan, m.descriptor.shape);
      if (!t.ok()) return fail_locked(t.status());
      landed_[k] = *std::move(t);
    } else {
      to_land.emplace_back(k, std::move(owned));
    }
  }
  if (to_land.empty()) return finish_locked(std::move(landed_));
  landing_ = to_land.size();
  asio::post(core_->executor(),
             [self = shared_from_this(), to_land = std::move(to_land)]() mutable {
               for (auto& [k, owned] : to_land) self->land_locally(k, std::move(owned));
             });
}

void remote_import::landed_locked(std::size_t k, absl::StatusOr<tensor> t) {
  if (!t.ok()) {
    finish_locked(bundle_ ? remote_detail::for_member(t.status(), k, members_.size()) : t.status());
  } else {
    landed_[k] = *std::move(t);
  }
  if (--landing_ > 0) return;
  if (!finished_) finish_locked(std::move(landed_));
  landed_.clear();  // a failed import's other tensors go
  cleanup_locked();
}

void remote_import::land_locally(std::size_t k, device_buffer buffer) {
  // The fetched bytes become a local tensor of host memory, imported onto
  // the target as a compact copy: the staging pipeline for a GPU, the
  // strided copy kernels for a span.
  tensor_description desc;
  desc.data = buffer.data();
  desc.device = host_;
  const member& m = members_[k];  // fixed since start
  desc.dtype = m.descriptor.type;
  desc.shape = m.descriptor.shape;
  if (m.lands == layout::span) {
    desc.strides = m.descriptor.strides;
    desc.byte_offset = m.plan.plan.address - m.plan.span_begin;
  }
  managed_tensor local = make_managed_tensor(
      std::move(desc),
      [b = std::make_shared<device_buffer>(std::move(buffer))]() mutable { b->reset(); });
  import_options o;
  o.target = options_.target;
  o.copy = true;
  o.require_contiguous = true;
  o.require_writable = options_.require_writable;
  o.min_alignment = options_.min_alignment;
  o.consumer_stream = options_.consumer_stream;
  async_import_dlpack(core_->rt(), local, o,
                      [self = shared_from_this(), k](absl::StatusOr<tensor> result) mutable {
                        std::lock_guard lock(self->core_->ucx().mutex());
                        self->landed_locked(k, std::move(result));
                      });
  if (!local.empty()) {
    // Refused before it started (it says why in the handler); the buffer
    // goes with the handle.
    local.reset();
  }
}

}  // namespace dlasync::detail
