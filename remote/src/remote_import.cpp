#include "remote/src/remote_import.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asio/post.hpp"
#include "dlasync/transfer/import.hpp"
#include "dlasync/transfer/import_error.hpp"
#include "dlasync/transfer/producer.hpp"
#include "remote/src/remote_core.hpp"
#include "runtime/src/runtime_core.hpp"
#include "transfer/src/dlpack/tensor_factory.hpp"

namespace dlasync::detail {
namespace {

using remote_detail::hold_release;
using remote_detail::hold_reply;
using remote_detail::hold_request;

// A strided tensor is fetched run by run (remote_node_options::
// min_run_bytes) when there are at most this many runs.
constexpr std::uint64_t max_runs = 1 << 16;

absl::Status in_flight(absl::Status s) {
  return with_import_error(std::move(s),
                           import_error{.consumed = true, .rule = "", .copy_reasons = ""});
}

}  // namespace

remote_import::remote_import(std::shared_ptr<remote_core> core, done_fn done)
    : core_(std::move(core)), done_(std::move(done)) {}

remote_import::~remote_import() = default;

void remote_import::start(const remote_descriptor& d, const import_options& options) {
  runtime& rt = core_->rt();
  absl::StatusOr<remote_detail::remote_plan> planned =
      remote_detail::plan_remote(d, options, rt.registry());
  std::unique_lock lock(core_->ucx().mutex());
  if (!planned.ok()) return finish_locked(planned.status());
  if (core_->stopping()) {
    return finish_locked(with_import_error(
        absl::UnavailableError("the remote node is shutting down; import before shutdown"),
        import_error{.consumed = false, .rule = "shutdown", .copy_reasons = ""}));
  }
  plan_ = *std::move(planned);
  descriptor_ = d;
  options_ = options;
  if (!options_.target) options_.target = host_device;
  host_ = options_.target->kind == device_kind::cpu ? *options_.target : host_device;

  // The endpoint decides how the bytes move, and so how much memory lands.
  absl::StatusOr<exporter_endpoint*> e = core_->endpoint_locked(descriptor_.worker_address);
  if (!e.ok()) return finish_locked(in_flight(e.status()));
  endpoint_ = *e;
  switch (core_->options().fetch) {
    case remote_fetch::automatic: rma_ = endpoint_->native_rma; break;
    case remote_fetch::rma: rma_ = true; break;
    case remote_fetch::active_messages: rma_ = false; break;
  }
  if (rma_ && plan_.plan.element_count > 0) {
    if (ucs_status_t s = ucp_ep_rkey_unpack(endpoint_->ep, descriptor_.rkey.data(), &rkey_);
        s != UCS_OK) {
      rkey_ = nullptr;
      return finish_locked(with_import_error(
          remote_detail::ucx_error(s,
                                   "the descriptor's remote key cannot be unpacked; it is "
                                   "corrupt or from another UCX"),
          import_error{.consumed = false, .rule = "remote_region", .copy_reasons = ""}));
    }
  }
  const std::uint64_t min_run = core_->options().min_run_bytes != 0 ? core_->options().min_run_bytes
                                : rma_                              ? std::uint64_t{4} << 10
                                                                    : std::uint64_t{16} << 10;
  const import_plan& p = plan_.plan;
  if (p.element_count == 0) {
    kind_ = fetch_kind::whole;
    fetch_bytes_ = 0;
  } else if (p.compact) {
    kind_ = fetch_kind::whole;
    fetch_bytes_ = p.byte_size;
  } else {
    const remote_detail::run_shape run =
        remote_detail::contiguous_run(d.shape, d.strides, d.type.padded_size());
    const std::uint64_t runs = run.bytes == 0 ? 0 : p.byte_size / run.bytes;
    if (!d.type.is_sub_byte() && run.bytes >= min_run && runs <= max_runs) {
      kind_ = fetch_kind::runs;
      fetch_bytes_ = p.byte_size;
    } else {
      kind_ = fetch_kind::span;
      fetch_bytes_ = plan_.span_bytes;
    }
  }
  memory_budget& budget = *core_of(rt).budget();
  if (budget.limit() != 0 && fetch_bytes_ > budget.limit()) {
    finish_locked(
        with_import_error(absl::ResourceExhaustedError(absl::StrCat(
                              "the remote tensor needs ", fetch_bytes_,
                              " bytes here, above the whole copy budget of ", budget.limit(),
                              " bytes; raise runtime_options::copy_memory_budget")),
                          import_error{.consumed = false, .rule = "budget", .copy_reasons = ""}));
    return cleanup_locked();
  }
  timeout_ =
      std::make_unique<asio::steady_timer>(core_->executor(), core_->options().import_timeout);
  timeout_->async_wait(
      [weak = weak_from_this(), t = core_->options().import_timeout](const asio::error_code& ec) {
        if (ec) return;
        if (std::shared_ptr<remote_import> self = weak.lock()) {
          self->cancel(absl::DeadlineExceededError(absl::StrCat(
              "the remote import did not finish within remote_node_options::import_timeout (",
              t.count(), " ms); the exporter is slow or gone")));
        }
      });
  waiting_for_budget_ = true;
  lock.unlock();
  const std::uint64_t ticket =
      budget.acquire(fetch_bytes_, [self = shared_from_this()](absl::Status s) mutable {
        asio::any_io_executor ex = self->core_->executor();
        asio::post(ex,
                   [self = std::move(self), s = std::move(s)]() mutable { self->on_budget(s); });
      });
  lock.lock();
  budget_ticket_ = ticket;
}

void remote_import::on_budget(const absl::Status& granted) {
  std::lock_guard lock(core_->ucx().mutex());
  waiting_for_budget_ = false;
  if (!granted.ok()) return finish_locked(granted);
  budget_held_ = fetch_bytes_;
  if (finished_ || core_->stopping()) {
    if (!finished_) finish_locked(in_flight(absl::CancelledError("the remote node shut down")));
    return cleanup_locked();
  }
  if (fetch_bytes_ > 0) {
    absl::StatusOr<device_buffer> b = core_->rt().allocate(host_, fetch_bytes_);
    if (!b.ok()) {
      finish_locked(in_flight(b.status()));
      return cleanup_locked();
    }
    buffer_ = *std::move(b);
  }
  if (!endpoint_->failure.ok()) {  // lost while this import waited
    finish_locked(in_flight(endpoint_->failure));
    return cleanup_locked();
  }
  request_hold_locked();
}

void remote_import::request_hold_locked() {
  request_id_ = core_->next_request_id_locked();
  core_->track_locked(shared_from_this());
  endpoint_->users.push_back(weak_from_this());
  hold_request m;
  m.lease_id = descriptor_.lease_id;
  m.request_id = request_id_;
  hold_requested_ = true;
  sent_ = std::chrono::steady_clock::now();
  core_->send_locked(endpoint_->ep, remote_detail::am_hold_request, &m, sizeof(m), true);
  core_->ucx().progress();
}

void remote_import::on_hold_reply_locked(const hold_reply& m) {
  if (!hold_requested_ || hold_granted_) return;  // one answer only
  if (m.code != 0) {
    core_->untrack_locked(request_id_);
    hold_requested_ = false;
    std::string message(m.message, strnlen(m.message, sizeof(m.message)));
    const auto code = static_cast<absl::StatusCode>(m.code);
    finish_locked(with_import_error(
        absl::Status(
            code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
            absl::StrCat("the exporter refused lease ", descriptor_.lease_id, ": ", message)),
        import_error{.consumed = false, .rule = "lease", .copy_reasons = ""}));
    return cleanup_locked();
  }
  hold_granted_ = true;
  hold_end_ = sent_ + std::chrono::microseconds(m.remaining_us);
  if (finished_) {
    core_->untrack_locked(request_id_);
    release_hold_locked();
    return cleanup_locked();
  }
  fetch_locked();
}

void remote_import::fetch_locked() {
  keep_alive_ = shared_from_this();
  gets_outstanding_ = 1;  // held until every get is issued
  const import_plan& p = plan_.plan;
  auto* out = static_cast<unsigned char*>(buffer_.data());
  if (p.element_count > 0) {
    switch (kind_) {
      case fetch_kind::whole: get_locked(p.address, out, fetch_bytes_); break;
      case fetch_kind::span: get_locked(plan_.span_begin, out, fetch_bytes_); break;
      case fetch_kind::runs: {
        const std::uint64_t elem = descriptor_.type.padded_size();
        const remote_detail::run_shape run =
            remote_detail::contiguous_run(descriptor_.shape, descriptor_.strides, elem);
        const std::size_t outer = descriptor_.shape.size() - run.inner_dims;
        std::vector<std::int64_t> index(outer, 0);
        std::uint64_t written = 0;
        for (;;) {
          std::int64_t offset = 0;
          for (std::size_t i = 0; i < outer; ++i) offset += index[i] * descriptor_.strides[i];
          get_locked(
              p.address + static_cast<std::uint64_t>(offset * static_cast<std::int64_t>(elem)),
              out + written, run.bytes);
          written += run.bytes;
          bool done = true;
          for (std::size_t i = outer; i-- > 0;) {
            if (++index[i] < descriptor_.shape[i]) {
              done = false;
              break;
            }
            index[i] = 0;
          }
          if (done) break;
        }
        break;
      }
    }
  }
  core_->ucx().progress();
  on_get_locked(UCS_OK);  // the issuing guard
}

void remote_import::get_locked(std::uint64_t remote, void* local, std::uint64_t bytes) {
  ++gets_outstanding_;
  if (!rma_) {
    remote_detail::fetch_request m;
    m.lease_id = descriptor_.lease_id;
    m.request_id = request_id_;
    m.piece = pieces_.size();
    m.address = remote;
    m.length = bytes;
    pieces_.push_back(piece{static_cast<std::uint64_t>(static_cast<unsigned char*>(local) -
                                                       static_cast<unsigned char*>(buffer_.data())),
                            bytes, false});
    core_->send_locked(endpoint_->ep, remote_detail::am_fetch_request, &m, sizeof(m), true);
    return;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &remote_import::on_get;
  param.user_data = this;
  ucs_status_ptr_t r = ucp_get_nbx(endpoint_->ep, local, bytes, remote, rkey_, &param);
  if (r == nullptr) return on_get_locked(UCS_OK);
  if (UCS_PTR_IS_ERR(r)) return on_get_locked(UCS_PTR_STATUS(r));
}

void remote_import::on_get(void* request, ucs_status_t status, void* user_data) {
  ucp_request_free(request);
  static_cast<remote_import*>(user_data)->on_get_locked(status);
}

void remote_import::on_received(void* request, ucs_status_t status, std::size_t, void* user_data) {
  ucp_request_free(request);
  static_cast<remote_import*>(user_data)->on_get_locked(status);
}

void remote_import::on_fetch_data_locked(const remote_detail::fetch_data& m, void* data,
                                         std::size_t length, const ucp_am_recv_param_t* param) {
  // The exporter is untrusted too: a piece it was not asked for, twice, or
  // of another length is an error, and never written.
  if (rma_ || m.piece >= pieces_.size() || pieces_[m.piece].done) return;
  piece& p = pieces_[m.piece];
  p.done = true;
  if (m.code != 0) {
    if (exporter_refusal_.ok()) {
      exporter_refusal_ = absl::Status(
          static_cast<absl::StatusCode>(m.code),
          absl::StrCat("the exporter refused to send lease ", descriptor_.lease_id,
                       "'s bytes: its hold or the lease ended, or the request was out of bounds"));
    }
    return on_get_locked(UCS_ERR_REJECTED);
  }
  if (length != p.length || m.length != p.length) return on_get_locked(UCS_ERR_MESSAGE_TRUNCATED);
  void* dest = static_cast<unsigned char*>(buffer_.data()) + p.offset;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    std::memcpy(dest, data, length);
    return on_get_locked(UCS_OK);
  }
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.recv_am = &remote_import::on_received;
  rp.user_data = this;
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(core_->ucx().worker(), data, dest, length, &rp);
  if (r == nullptr) return on_get_locked(UCS_OK);
  if (UCS_PTR_IS_ERR(r)) return on_get_locked(UCS_PTR_STATUS(r));
}

void remote_import::on_get_locked(ucs_status_t status) {
  if (status != UCS_OK && get_status_ == UCS_OK) get_status_ = status;
  if (--gets_outstanding_ > 0) return;
  std::shared_ptr<remote_import> self = std::move(keep_alive_);
  fetched_locked();
}

void remote_import::fetched_locked() {
  core_->untrack_locked(request_id_);
  release_hold_locked();
  if (finished_) return cleanup_locked();
  if (!exporter_refusal_.ok()) {
    finish_locked(in_flight(exporter_refusal_));
    return cleanup_locked();
  }
  if (get_status_ != UCS_OK) {
    absl::Status why = remote_detail::ucx_error(
        get_status_, absl::StrCat("fetching lease ", descriptor_.lease_id,
                                  " from its exporter failed; the exporter went away or "
                                  "the transfer broke"));
    // A lost peer, whatever UCX calls it, is Unavailable.
    if (why.code() == absl::StatusCode::kDeadlineExceeded ||
        why.code() == absl::StatusCode::kInternal) {
      why = absl::UnavailableError(why.message());
    }
    finish_locked(in_flight(std::move(why)));
    return cleanup_locked();
  }
  if (std::chrono::steady_clock::now() > hold_end_) {
    finish_locked(in_flight(absl::DeadlineExceededError(
        absl::StrCat("lease ", descriptor_.lease_id,
                     " ended while its bytes were moving, so they may have been released under the "
                     "transfer; publish with a longer publish_options::lease"))));
    return cleanup_locked();
  }
  if (rkey_ != nullptr) {
    if (!core_->ucx().finalized()) ucp_rkey_destroy(rkey_);
    rkey_ = nullptr;
  }
  // The fetched bytes, owned by a buffer that returns the budget.
  std::shared_ptr<memory_budget> budget = core_of(core_->rt()).budget();
  const std::uint64_t held = std::exchange(budget_held_, 0);
  void* data = buffer_.data();
  device_buffer owned(host_, data, fetch_bytes_,
                      [inner = std::move(buffer_), budget, held](void*, std::uint64_t) mutable {
                        inner.reset();
                        if (held != 0) budget->release(held);
                      });
  if (kind_ != fetch_kind::span && options_.target->kind == device_kind::cpu) {
    finish_locked(tensor_factory::make_copy(std::move(owned), plan_.plan, descriptor_.shape));
    return cleanup_locked();
  }
  asio::post(core_->executor(), [self = shared_from_this(), owned = std::move(owned)]() mutable {
    self->land_locally(std::move(owned), 0);
  });
}

void remote_import::land_locally(device_buffer buffer, std::uint64_t /*budget_bytes*/) {
  // The fetched bytes become a local tensor of host memory, imported onto
  // the target as a compact copy: the staging pipeline for a GPU, the
  // strided copy kernels for a span.
  tensor_description desc;
  desc.data = buffer.data();
  desc.device = host_;
  desc.dtype = descriptor_.type;
  desc.shape = descriptor_.shape;
  if (kind_ == fetch_kind::span) {
    desc.strides = descriptor_.strides;
    desc.byte_offset = plan_.plan.address - plan_.span_begin;
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
                      [self = shared_from_this()](absl::StatusOr<tensor> result) mutable {
                        std::lock_guard lock(self->core_->ucx().mutex());
                        self->finish_locked(std::move(result));
                        self->cleanup_locked();
                      });
  if (!local.empty()) {
    // Refused before it started (it says why in the handler); the buffer
    // goes with the handle.
    local.reset();
  }
}

void remote_import::release_hold_locked() {
  if (!hold_granted_ || hold_released_) return;
  hold_released_ = true;
  if (core_->stopping() || endpoint_ == nullptr || !endpoint_->failure.ok()) return;
  hold_release m;
  m.lease_id = descriptor_.lease_id;
  m.request_id = request_id_;
  core_->send_locked(endpoint_->ep, remote_detail::am_hold_release, &m, sizeof(m), false);
  core_->ucx().progress();
}

void remote_import::cleanup_locked() {
  if (gets_outstanding_ > 0) return;
  if (rkey_ != nullptr) {
    if (!core_->ucx().finalized()) ucp_rkey_destroy(rkey_);
    rkey_ = nullptr;
  }
  buffer_.reset();
  if (budget_held_ != 0) {
    core_of(core_->rt()).budget()->release(std::exchange(budget_held_, 0));
  }
  if (timeout_) timeout_->cancel();
}

void remote_import::finish_locked(absl::StatusOr<tensor> result) {
  if (finished_) return;
  finished_ = true;
  if (timeout_) timeout_->cancel();
  std::move(done_)(std::move(result));
  done_ = nullptr;
}

void remote_import::on_endpoint_failed_locked(const absl::Status& why) {
  if (hold_requested_ && !hold_granted_) {
    core_->untrack_locked(request_id_);
    hold_requested_ = false;
    finish_locked(in_flight(why));
    cleanup_locked();
    return;
  }
  // Gets in flight complete later, with an error from UCX (peer error
  // handling), and free the buffer then; the handler learns now.
  finish_locked(in_flight(why));
  abandon_pieces_locked();
}

void remote_import::abandon_pieces_locked() {
  // Pieces asked for by active message whose bytes have not begun to
  // arrive never will (or are not wanted any more): a late answer finds no
  // import and is dropped. Rendezvous receives under way finish with UCX.
  if (rma_ || gets_outstanding_ == 0) return;
  std::shared_ptr<remote_import> self = shared_from_this();  // the last piece may free it
  for (piece& p : pieces_) {
    if (p.done) continue;
    p.done = true;
    on_get_locked(UCS_ERR_CANCELED);
  }
}

void remote_import::cancel(absl::Status why) {
  std::unique_lock lock(core_->ucx().mutex());
  if (finished_) return;
  finish_locked(in_flight(std::move(why)));
  if (waiting_for_budget_) {
    const std::uint64_t ticket = budget_ticket_;
    lock.unlock();
    core_of(core_->rt()).budget()->cancel(ticket, absl::CancelledError("remote import cancelled"));
    return;
  }
  if (hold_requested_ && !hold_granted_) return;  // the reply releases the hold
  abandon_pieces_locked();
  cleanup_locked();
}

std::shared_ptr<remote_import> make_remote_import(
    remote_core& core, absl::AnyInvocable<void(absl::StatusOr<tensor>) &&> done) {
  return std::make_shared<remote_import>(core.shared_from_this(), std::move(done));
}

void start(const std::shared_ptr<remote_import>& op, const remote_descriptor& descriptor,
           const import_options& options) {
  op->start(descriptor, options);
}

void cancel(remote_import& op) {
  op.cancel(absl::CancelledError("the remote import was cancelled"));
}

}  // namespace dlasync::detail
