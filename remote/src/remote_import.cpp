#include "remote/src/remote_import.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asio/post.hpp"
#include "dlasync/import.hpp"
#include "dlasync/producer.hpp"
#include "remote/src/remote_core.hpp"
#include "runtime/src/runtime_core.hpp"
#include "transfer/src/dlpack/tensor_factory.hpp"
#include "transfer/src/plan/transfer_plan.hpp"

namespace dlasync::detail {
namespace {

using remote_detail::hold_release;
using remote_detail::hold_reply;
using remote_detail::hold_request;
using remote_detail::piece_plan;

// The longest hold an exporter's answer is believed for (about 12 days):
// the number is a peer's, and must not overflow the clock's arithmetic.
constexpr std::uint64_t max_hold_us = std::uint64_t{1} << 40;

absl::Status in_flight(absl::Status s) {
  return with_import_error(std::move(s),
                           import_error{.consumed = true, .rule = "", .copy_reasons = ""});
}

}  // namespace

absl::StatusCode peer_code(std::int32_t code) {
  return code > 0 && code <= static_cast<std::int32_t>(absl::StatusCode::kUnauthenticated)
             ? static_cast<absl::StatusCode>(code)
             : absl::StatusCode::kUnknown;
}

remote_import::remote_import(std::shared_ptr<remote_core> core)
    : core_(std::move(core)), budget_wait_(*core_of(core_->rt()).budget()) {}

remote_import::~remote_import() = default;

void remote_import::start(absl::AnyInvocable<void(absl::StatusOr<tensor>) &&> done,
                          const remote_descriptor& d, const import_options& options) {
  std::vector<member> members(1);
  members[0].descriptor = d;
  begin(
      [done = std::move(done)](absl::StatusOr<std::vector<tensor>> r) mutable {
        if (!r.ok()) return std::move(done)(r.status());
        std::move(done)(std::move(r->front()));
      },
      std::move(members), /*bundle=*/false, options);
}

void remote_import::start(done_fn done, const remote_bundle& b, const import_options& options) {
  // The bundle's own framing, before any member is looked at.
  absl::Status refused;
  if (b.members.empty() || b.members.size() > remote_bundle::max_members) {
    refused = absl::InvalidArgumentError(absl::StrCat("the bundle has ", b.members.size(),
                                                      " members; import from 1 to ",
                                                      remote_bundle::max_members));
  }
  if (refused.ok()) refused = remote_detail::check_member_indices(b);
  std::vector<member> members(refused.ok() ? b.members.size() : 0);
  for (std::size_t k = 0; k < members.size() && refused.ok(); ++k) {
    const remote_bundle::member& m = b.members[k];
    const remote_descriptor& d = m.descriptor;
    if (d.lease_id != b.lease_id || d.exporter_address != b.exporter_address ||
        d.exporter_port != b.exporter_port) {
      refused = absl::InvalidArgumentError(absl::StrCat(
          "bundle member ", k, " names lease ", d.lease_id, " at ", d.exporter_address, " port ",
          d.exporter_port, " where the bundle names lease ", b.lease_id, " at ", b.exporter_address,
          " port ", b.exporter_port, "; a bundle's members are the bundle's"));
    }
    members[k].index = m.index;
    members[k].descriptor = d;
  }
  if (!refused.ok()) {
    refused = with_import_error(
        std::move(refused), import_error{.consumed = false, .rule = "bundle", .copy_reasons = ""});
    members.clear();
  }
  begin(std::move(done), std::move(members), /*bundle=*/true, options, std::move(refused));
}

void remote_import::begin(done_fn done, std::vector<member> members, bool bundle,
                          const import_options& options, absl::Status refused) {
  runtime& rt = core_->rt();
  for (std::size_t k = 0; k < members.size() && refused.ok(); ++k) {
    absl::StatusOr<remote_detail::remote_plan> planned =
        remote_detail::plan_remote(members[k].descriptor, options, rt.registry());
    if (!planned.ok()) {
      refused = bundle ? remote_detail::for_member(planned.status(), k, members.size())
                       : planned.status();
    } else {
      members[k].plan = *std::move(planned);
    }
  }
  std::unique_lock lock(core_->ucx().mutex());
  done_ = std::move(done);
  if (finished_) {
    // Cancelled before it started or while it planned: nothing was asked
    // for; the handler learns now.
    std::move(done_)(*std::exchange(unstarted_result_, std::nullopt));
    done_ = nullptr;
    return;
  }
  if (!refused.ok()) return finish_locked(std::move(refused));
  if (core_->stopping()) {
    return finish_locked(with_import_error(
        absl::UnavailableError("the remote node is shutting down; import before shutdown"),
        import_error{.consumed = false, .rule = "shutdown", .copy_reasons = ""}));
  }
  members_ = std::move(members);
  bundle_ = bundle;
  const remote_descriptor& first = members_.front().descriptor;
  lease_id_ = first.lease_id;
  options_ = options;
  if (!options_.target) options_.target = host_device;
  host_ = options_.target->kind == device_kind::cpu ? *options_.target : host_device;

  absl::StatusOr<exporter_endpoint*> e =
      core_->endpoint_locked(first.exporter_address, first.exporter_port);
  if (!e.ok()) return finish_locked(in_flight(e.status()));
  endpoint_ = *e;
  bool unwired = false;
  if (absl::Status s = plan_fetch_locked(unwired); !s.ok()) return finish_locked(std::move(s));
  // Tracked from here, so that shutdown finds it wherever it waits.
  request_id_ = core_->next_request_id_locked();
  core_->track_locked(shared_from_this());
  tracked_ = true;
  timeout_ =
      std::make_unique<asio::steady_timer>(core_->executor(), core_->options().import_timeout);
  timeout_->async_wait(
      [weak = weak_from_this(), t = core_->options().import_timeout](const asio::error_code& ec) {
        if (ec) return;
        if (std::shared_ptr<remote_import> self = weak.lock()) self->timed_out(t);
      });
  if (unwired) {
    // How the bytes come depends on the lanes UCX wires up: chosen then.
    awaiting_wireup_ = true;
    endpoint_->awaiting_wireup.push_back(weak_from_this());
    return;
  }
  ask_budget_locked();
}

void remote_import::ask_budget_locked() {
  memory_budget& budget = *core_of(core_->rt()).budget();
  // Budget free now, with nobody in line: taken here, and the hold asked at
  // once, without a hop through the executor (a small import's round trip
  // is mostly such hops).
  if (budget.try_acquire(fetch_bytes_)) {
    budget_held_ = fetch_bytes_;
    return budget_granted_locked();
  }
  // Asked under the lock, so that shutdown and cancellation find the wait
  // with its ticket: the grant is posted, never run inside the call.
  budget_wait_.begin(
      fetch_bytes_,
      [self = shared_from_this()](absl::Status s) mutable {
        asio::any_io_executor ex = self->core_->executor();
        asio::post(ex,
                   [self = std::move(self), s = std::move(s)]() mutable { self->on_budget(s); });
      },
      [&budget](std::uint64_t bytes, memory_budget::grant_fn granted) {
        return budget.acquire(bytes, std::move(granted));
      });
}

std::string remote_import::name_of(std::size_t k) const {
  if (!bundle_) return absl::StrCat("lease ", lease_id_);
  return absl::StrCat("member ", members_[k].index, " of lease ", lease_id_);
}

void remote_import::on_budget(const absl::Status& granted) {
  std::lock_guard lock(core_->ucx().mutex());
  budget_wait_.end();
  if (budget_taken_) return;  // shutdown gave it back already
  if (!granted.ok()) {
    finish_locked(granted);  // a cancellation already finished it
    return wind_down_locked();
  }
  budget_held_ = fetch_bytes_;
  budget_granted_locked();
}

void remote_import::budget_granted_locked() {
  if (finished_ || core_->stopping()) {
    finish_locked(in_flight(absl::CancelledError("the remote node shut down")));
    return wind_down_locked();
  }
  for (member& m : members_) {
    if (m.fetch_bytes == 0) continue;
    absl::StatusOr<device_buffer> b = core_->rt().allocate(host_, m.fetch_bytes);
    if (!b.ok()) return fail_locked(b.status());
    m.buffer = *std::move(b);
  }
  if (!endpoint_->failure.ok()) return fail_locked(endpoint_->failure);  // lost meanwhile
  request_hold_locked();
}

void remote_import::request_hold_locked() {
  // The imports that ended go first: a weak reference keeps an object made
  // with make_shared allocated, so on a long-lived endpoint they would pile
  // up, one for every import ever made through it.
  std::erase_if(endpoint_->users,
                [](const std::weak_ptr<remote_import>& u) { return u.expired(); });
  endpoint_->users.push_back(weak_from_this());
  hold_request m;
  m.send_bytes = rma_ ? 0 : 1;
  m.lease_id = lease_id_;
  m.request_id = request_id_;
  std::string asked;  // a bundle's members, each with its digest
  if (bundle_) {
    // Small members may come packed in the grant, the hold ended with it
    // (not when they are read by RMA).
    m.flags = rma_ ? remote_detail::request_members
                   : static_cast<std::uint8_t>(remote_detail::request_members |
                                               remote_detail::request_bytes_with_grant);
    asked.resize(members_.size() * sizeof(remote_detail::member_request));
    for (std::size_t k = 0; k < members_.size(); ++k) {
      remote_detail::member_request r;
      r.index = members_[k].index;
      r.digest = remote_detail::description_digest(members_[k].descriptor);
      std::memcpy(asked.data() + k * sizeof(r), &r, sizeof(r));
    }
  } else {
    // A small tensor's bytes may come with the grant, the hold ended with it.
    m.flags = rma_ ? 0 : remote_detail::request_bytes_with_grant;
    m.digest = remote_detail::description_digest(members_[0].descriptor);
  }
  hold_requested_ = true;
  sent_ = std::chrono::steady_clock::now();
  core_->send_locked(endpoint_->ep, remote_detail::am_hold_request, &m, sizeof(m), asked);
  core_->ucx().progress();
}

void remote_import::on_hold_reply_locked(const hold_reply& m, void* data, std::size_t length,
                                         const ucp_am_recv_param_t* param) {
  const ucp_ep_h from = ucx_worker::reply_endpoint(param);
  // Only the exporter asked answers, once.
  if (endpoint_ == nullptr || from != endpoint_->ep || !hold_requested_ || reply_seen_) return;
  reply_seen_ = true;
  endpoint_->heard_from();
  if (m.code != 0) {
    std::string message(m.message, strnlen(m.message, sizeof(m.message)));
    finish_locked(with_import_error(
        absl::Status(peer_code(m.code),
                     absl::StrCat("the exporter refused lease ", lease_id_, ": ", message)),
        import_error{.consumed = false, .rule = "lease", .copy_reasons = ""}));
    return wind_down_locked();
  }
  hold_granted_ = true;
  hold_id_ = m.hold_id;
  secret_ = m.secret;
  hold_end_ = sent_ + std::chrono::microseconds(std::min(m.remaining_us, max_hold_us));
  const bool with_bytes = (m.flags & remote_detail::reply_bytes_with_grant) != 0;
  // A grant with its bytes ended the hold: the exporter expects no release.
  if (with_bytes) hold_released_ = true;
  if (finished_) return wind_down_locked();  // cancelled meanwhile: released now
  if (bundle_) return on_bundle_grant_locked(with_bytes, data, length, param);
  // A grant carries only a one-piece tensor of its plan, and a small one.
  const bool one_piece = m.pieces == 1 && (m.plan == static_cast<std::uint8_t>(piece_plan::whole) ||
                                           m.plan == static_cast<std::uint8_t>(piece_plan::dense));
  if (with_bytes && (!one_piece || length > remote_detail::max_bytes_with_grant)) {
    return fail_locked(absl::DataLossError(absl::StrCat(
        "the exporter's grant for lease ", lease_id_, " carries ", length, " bytes as a tensor of ",
        m.pieces, " pieces of kind ", m.plan, "; a grant carries only a one-piece tensor of up to ",
        remote_detail::max_bytes_with_grant, " bytes")));
  }
  if ((with_bytes && rma_) || (!with_bytes && length != 0)) {
    return fail_locked(absl::DataLossError(
        absl::StrCat("the exporter's grant for lease ", lease_id_, " carries ", length,
                     " bytes where this import ", rma_ ? "reads them itself" : "expects none",
                     "; it does not speak dlasync's protocol")));
  }
  if (rma_) {
    if (m.plan != static_cast<std::uint8_t>(piece_plan::none) || m.pieces != 0) {
      return fail_locked(absl::DataLossError(
          "the exporter granted an RMA hold with pieces; it does not speak dlasync's protocol"));
    }
    return fetch_rma_locked();
  }
  if (!adopt_plan_locked(0, m.plan, m.pieces)) {
    return fail_locked(absl::DataLossError(absl::StrCat(
        "the exporter's plan for lease ", lease_id_, " (", m.pieces, " pieces of kind ", m.plan,
        ") does not fit the descriptor; it runs another dlasync, or "
        "it does not describe its tensor honestly")));
  }
  if (with_bytes) {
    // The grant's data is piece 0 of its plan, checked as any piece is.
    remote_detail::piece only;
    only.request_id = m.request_id;
    only.plan = m.plan;
    only.index = 0;
    only.count = m.pieces;
    only.length = length;
    return on_piece_locked(only, data, length, param);
  }
  advance_locked();
}

void remote_import::fail_locked(absl::Status why) {
  finish_locked(in_flight(std::move(why)));
  wind_down_locked();
}

void remote_import::wind_down_locked() {
  // Late answers find no import and are dropped (a rendezvous is completed
  // for its sender as dropped).
  if (tracked_ && (reply_seen_ || !hold_requested_)) {
    untrack_locked();
  } else if (tracked_ && forget_ == nullptr) {
    forget_locked();
  }
  release_hold_locked();
  cleanup_locked();
}

void remote_import::forget_locked() {
  // An exporter that is heard from (it serves other imports on this
  // connection) but never answers this hold would otherwise keep it in the
  // node's table until shutdown. A grant that comes after this finds no
  // import: that hold ends with its lease, or when the connection closes.
  forget_ =
      std::make_unique<asio::steady_timer>(core_->executor(), core_->options().import_timeout);
  forget_->async_wait([weak = weak_from_this()](const asio::error_code& ec) {
    if (ec) return;
    std::shared_ptr<remote_import> self = weak.lock();  // outlives the lock below
    if (self == nullptr) return;
    std::lock_guard lock(self->core_->ucx().mutex());
    if (!self->reply_seen_) self->untrack_locked();
  });
}

void remote_import::untrack_locked() {
  if (tracked_) core_->untrack_locked(request_id_);
  tracked_ = false;
}

void remote_import::release_hold_locked() {
  if (!hold_granted_ || hold_released_) return;
  hold_released_ = true;
  if (core_->stopping() || endpoint_ == nullptr || !endpoint_->failure.ok()) return;
  hold_release m;
  m.lease_id = lease_id_;
  m.hold_id = hold_id_;
  m.secret = secret_;
  core_->send_locked(endpoint_->ep, remote_detail::am_hold_release, &m, sizeof(m));
  core_->ucx().progress();
}

void remote_import::cleanup_locked() {
  if (writes_in_flight_ > 0 || rma_issuing_) return;
  keys_.clear();
  for (member& m : members_) m.buffer.reset();
  if (budget_held_ != 0) {
    core_of(core_->rt()).budget()->release(std::exchange(budget_held_, 0));
  }
  if (timeout_) timeout_->cancel();
}

void remote_import::finish_locked(absl::StatusOr<std::vector<tensor>> result) {
  if (finished_) return;
  finished_ = true;
  if (!done_) {
    // Not started yet (a cancel first): start hands this on.
    unstarted_result_ = std::move(result);
    return;
  }
  if (timeout_) timeout_->cancel();
  if (result.ok()) {
    const bool any_bytes = std::any_of(members_.begin(), members_.end(), [](const member& m) {
      return m.plan.plan.element_count > 0;
    });
    core_->count_completed_locked(rma_, any_bytes);
  }
  std::move(done_)(std::move(result));
  done_ = nullptr;
}

void remote_import::on_endpoint_failed_locked(const absl::Status& why) {
  // Writes under way end with errors from UCX (peer error handling); the
  // buffer goes then. The handler learns now; no answer can come any more.
  untrack_locked();
  fail_locked(why);
}

void remote_import::on_shutdown_locked() {
  finish_locked(in_flight(absl::CancelledError("the remote node shut down")));
  hold_released_ = true;  // the connection closes: the exporter ends the hold
  tracked_ = false;       // the node forgets every import
  if (budget_wait_.cancel(absl::CancelledError("the remote node shut down")) ==
      budget_wait::outcome::granted) {
    // Granted, and its grant on the way here: given back with the rest
    // (after_finalize_locked), not when it arrives.
    budget_held_ = fetch_bytes_;
    budget_taken_ = true;
  }
}

void remote_import::after_finalize_locked() {
  // The worker is gone, and every request with it: nothing writes into the
  // buffer any more, and the key went with the endpoints.
  writes_in_flight_ = 0;
  rma_issuing_ = false;
  cleanup_locked();     // the keys see the worker gone, and are not destroyed
  keep_alive_.reset();  // the caller holds this import
}

void remote_import::timed_out(std::chrono::milliseconds t) {
  {
    std::lock_guard lock(core_->ucx().mutex());
    if (finished_) return;
    // Nothing from the exporter on this connection for the last half of the
    // timeout, or longer: the link or the exporter is gone (UCX's TCP
    // transport tells only when the link's own timeouts expire, minutes
    // later). The connection is taken as lost: its imports, this one with
    // them, fail Unavailable, and the next import from this exporter
    // connects afresh. An exporter heard from meanwhile is slow, not gone:
    // this import alone ends, below.
    if (endpoint_ != nullptr && awaiting_wireup_ && !endpoint_->connected &&
        endpoint_->failure.ok()) {
      // UCX never finished making the connection: nothing can come over it.
      core_->endpoint_lost_locked(*endpoint_,
                                  absl::UnavailableError(absl::StrCat(
                                      "the connection to the exporter was not made within "
                                      "remote_node_options::import_timeout (",
                                      t.count(), " ms); it went away, or the link is down")),
                                  /*from_ucx=*/false);
      return;
    }
    if (endpoint_ != nullptr && hold_requested_ && endpoint_->failure.ok()) {
      const auto silent = std::chrono::steady_clock::now() - endpoint_->heard;
      if (silent >= t / 2) {
        core_->endpoint_lost_locked(
            *endpoint_,
            absl::UnavailableError(absl::StrCat(
                "nothing came from the exporter for ",
                std::chrono::duration_cast<std::chrono::milliseconds>(silent).count(),
                " ms, past half of remote_node_options::import_timeout (", t.count(),
                " ms): the connection to it is taken as lost; it went away or the link is down")),
            /*from_ucx=*/false);
        return;
      }
    }
  }
  cancel(absl::DeadlineExceededError(
      absl::StrCat("the remote import did not finish within remote_node_options::import_timeout (",
                   t.count(), " ms); the exporter is slow")));
}

void remote_import::cancel(absl::Status why) {
  std::unique_lock lock(core_->ucx().mutex());
  if (finished_) return;
  finish_locked(in_flight(std::move(why)));
  if (budget_wait_.waiting()) {
    // Its grant handler, with the grant or the cancellation, winds it down.
    lock.unlock();
    (void)budget_wait_.cancel(absl::CancelledError("remote import cancelled"));
    return;
  }
  // A hold asked for and not answered yet stays tracked: its answer
  // releases it.
  wind_down_locked();
}

std::shared_ptr<remote_import> make_remote_import(remote_core& core) {
  return std::make_shared<remote_import>(core.shared_from_this());
}

void start(const std::shared_ptr<remote_import>& op,
           absl::AnyInvocable<void(absl::StatusOr<tensor>) &&> done,
           const remote_descriptor& descriptor, const import_options& options) {
  op->start(std::move(done), descriptor, options);
}

void start(const std::shared_ptr<remote_import>& op,
           absl::AnyInvocable<void(absl::StatusOr<std::vector<tensor>>) &&> done,
           const remote_bundle& bundle, const import_options& options) {
  op->start(std::move(done), bundle, options);
}

void cancel(remote_import& op) {
  op.cancel(absl::CancelledError("the remote import was cancelled"));
}

}  // namespace dlasync::detail
