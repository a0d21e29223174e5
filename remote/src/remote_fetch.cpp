// How a remote import's bytes come (chosen once the connection is wired up,
// where that matters), and the bytes: the pieces its exporter sends, each
// checked against the descriptor before a byte of it is written, or,
// between trusted peers, the RMA gets the import issues itself.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dlasync/validate.hpp"
#include "remote/src/remote_core.hpp"
#include "remote/src/remote_import.hpp"
#include "runtime/src/runtime_core.hpp"
#include "transfer/src/plan/transfer_plan.hpp"

namespace dlasync::detail {
namespace {

using remote_detail::piece_plan;

bool known_plan(std::uint8_t plan) {
  switch (static_cast<piece_plan>(plan)) {
    case piece_plan::whole:
    case piece_plan::dense:
    case piece_plan::runs:
    case piece_plan::gathered: return true;
    case piece_plan::none: return false;
  }
  return false;
}

}  // namespace

absl::Status remote_import::choose_fetch_locked(std::vector<remote_detail::fetch_choice>& choices,
                                                bool& unwired) {
  // RMA only between trusted peers, with the exporter's keys; by default
  // only where UCX reads with a lane of its own (a connection wired up
  // tells).
  // A bundle is read one way: by RMA when every member with bytes can be.
  const remote_node_options& o = core_->options();
  const exporter_endpoint& e = *endpoint_;
  std::optional<bool> native;
  auto native_rma = [&e, &native, &unwired] {
    if (!e.wired()) unwired = true;
    if (!native) native = e.wired() && remote_core::native_rma(e.ep);
    return *native;
  };
  bool some_rma = false;
  bool some_pieces = false;
  auto choose = [&](remote_fetch mode) -> absl::Status {
    some_rma = false;
    some_pieces = false;
    for (std::size_t k = 0; k < members_.size(); ++k) {
      member& m = members_[k];
      absl::StatusOr<remote_detail::fetch_choice> fetch = remote_detail::choose_fetch(
          m.descriptor, m.plan, mode, o.trusted_peers, native_rma, o.min_run_bytes);
      if (!fetch.ok()) {
        return bundle_ ? remote_detail::for_member(fetch.status(), k, members_.size())
                       : fetch.status();
      }
      choices[k] = *fetch;
      if (m.plan.plan.element_count > 0) (fetch->rma ? some_rma : some_pieces) = true;
    }
    rma_ = mode == remote_fetch::rma || (some_rma && !some_pieces);
    return absl::OkStatus();
  };
  // Automatically, small imports take the pieces: over UCX 1.13's shared
  // memory they were faster below 16 MiB (docs/remote.md).
  remote_fetch mode = o.fetch;
  if (mode == remote_fetch::automatic) {
    std::uint64_t bytes = 0;
    for (const member& m : members_) {
      const std::uint64_t more = m.plan.plan.byte_size;
      bytes = more > UINT64_MAX - bytes ? UINT64_MAX : bytes + more;
    }
    const std::uint64_t least =
        o.min_rma_bytes != 0 ? o.min_rma_bytes : remote_detail::default_min_rma_bytes;
    if (bytes < least) mode = remote_fetch::active_messages;
  }
  absl::Status chosen = choose(mode);
  // Some members keyed and some not: all come as pieces.
  if (chosen.ok() && some_rma && some_pieces) chosen = choose(remote_fetch::active_messages);
  return chosen;
}

absl::Status remote_import::plan_fetch_locked(bool& unwired) {
  std::vector<remote_detail::fetch_choice> choices(members_.size());
  if (absl::Status s = choose_fetch_locked(choices, unwired); !s.ok() || unwired) return s;
  fetch_bytes_ = 0;
  for (std::size_t k = 0; k < members_.size(); ++k) {
    member& m = members_[k];
    m.lands = choices[k].span ? layout::span : layout::compact;
    m.fetch_bytes = choices[k].bytes;
    if (fetch_bytes_ + m.fetch_bytes < fetch_bytes_) {
      return with_import_error(
          absl::OutOfRangeError("the bundle's members together overflow 64 bits of bytes"),
          import_error{.consumed = false, .rule = "byte_size", .copy_reasons = ""});
    }
    fetch_bytes_ += m.fetch_bytes;
  }
  return detail::check_budget(bundle_ ? "the remote bundle" : "the remote tensor", fetch_bytes_,
                              core_of(core_->rt()).budget()->limit());
}

void remote_import::on_wired_locked() {
  awaiting_wireup_ = false;
  if (finished_) return;
  if (!endpoint_->failure.ok()) return fail_locked(endpoint_->failure);
  bool unwired = false;
  if (absl::Status s = plan_fetch_locked(unwired); !s.ok()) {
    finish_locked(std::move(s));
    return wind_down_locked();
  }
  ask_budget_locked();
}

bool remote_import::adopt_plan_locked(std::size_t k, std::uint8_t plan, std::uint64_t count) {
  member& m = members_[k];
  // Adopted already (from the grant, or from a piece that overtook it): the
  // same plan again, or a lie.
  if (m.walk) return static_cast<std::uint8_t>(m.walk->plan()) == plan && m.walk->count() == count;
  if (!known_plan(plan)) return false;
  const auto kind = static_cast<piece_plan>(plan);
  if (!remote_detail::piece_walk::fits(m.descriptor, m.plan, kind)) return false;
  remote_detail::piece_walk walk(m.descriptor, m.plan, kind);
  if (walk.count() != count) return false;
  m.walk.emplace(std::move(walk));
  m.piece_seen.assign(count, false);
  m.lands = kind == piece_plan::dense ? layout::span : layout::compact;
  pieces_expected_ += count;
  ++plans_adopted_;
  return true;
}

bool remote_import::adopt_plans_locked(const void* data, std::size_t length) {
  constexpr std::size_t entry = sizeof(remote_detail::member_plan);
  if (data == nullptr || length != members_.size() * entry) return false;
  for (std::size_t k = 0; k < members_.size(); ++k) {
    remote_detail::member_plan p;
    std::memcpy(&p, static_cast<const unsigned char*>(data) + k * entry, entry);
    if (!adopt_plan_locked(k, p.plan, p.pieces)) return false;
  }
  return true;
}

void remote_import::on_piece_locked(const remote_detail::piece& m, void* data, std::size_t length,
                                    const ucp_am_recv_param_t* param) {
  const ucp_ep_h from = ucx_worker::reply_endpoint(param);
  // Only from the exporter asked, only while the bytes are wanted; anything
  // else is dropped (UCX completes a dropped rendezvous for its sender).
  if (endpoint_ == nullptr || from != endpoint_->ep || rma_ || !hold_requested_ || finished_) {
    return;
  }
  endpoint_->heard_from();
  // A piece names its member and its plan: the grant's, or the first of a
  // member whose pieces overtook the grant.
  const std::size_t k = m.member;
  if (k >= members_.size() || !adopt_plan_locked(k, m.plan, m.count) || m.index >= m.count ||
      members_[k].piece_seen[m.index]) {
    return fail_locked(absl::DataLossError(absl::StrCat(
        "the exporter sent piece ", m.index, " of ", m.count, " (kind ", m.plan, ") of member ",
        m.member, " of lease ", lease_id_,
        ", which this import did not expect: a piece twice, of a member not asked for, or a "
        "plan that does not fit the descriptor")));
  }
  member& into = members_[k];
  into.piece_seen[m.index] = true;
  if (m.code != 0) {
    return fail_locked(absl::Status(
        peer_code(m.code), absl::StrCat("the exporter could not send ", name_of(k),
                                        "'s bytes; it may be short of memory, or shutting down")));
  }
  const remote_detail::piece_range expected = into.walk->at(m.index);
  if (m.offset != expected.offset || m.length != expected.length || length != expected.length ||
      expected.offset > into.fetch_bytes || expected.length > into.fetch_bytes - expected.offset) {
    return fail_locked(absl::DataLossError(
        absl::StrCat("the exporter's piece ", m.index, " of ", name_of(k), " holds ", length,
                     " bytes for offset ", m.offset, "; the descriptor puts ", expected.length,
                     " bytes at offset ", expected.offset)));
  }
  void* dest = static_cast<unsigned char*>(into.buffer.data()) + expected.offset;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
    if (length > 0) std::memcpy(dest, data, length);
    ++pieces_done_;
    return advance_locked();
  }
  ++writes_in_flight_;
  keep_alive_ = shared_from_this();
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.recv_am = &remote_import::on_received;
  rp.user_data = this;
  ucs_status_ptr_t r = ucp_am_recv_data_nbx(core_->ucx().worker(), data, dest, length, &rp);
  if (r == nullptr) return write_done_locked(UCS_OK);
  if (UCS_PTR_IS_ERR(r)) return write_done_locked(UCS_PTR_STATUS(r));
}

void remote_import::on_bundle_grant_locked(bool with_bytes, void* data, std::size_t length,
                                           const ucp_am_recv_param_t* param) {
  // Every member's plan, in the grant's data, sent with it; then, when
  // the grant carries the bytes, every member packed.
  const bool in_place = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0;
  if (rma_) return on_rma_bundle_grant_locked(with_bytes, data, length, in_place);
  const std::size_t plans = members_.size() * sizeof(remote_detail::member_plan);
  if (!in_place || length < plans || (!with_bytes && length != plans) ||
      !adopt_plans_locked(data, plans)) {
    return fail_locked(absl::DataLossError(
        absl::StrCat("the exporter's grant for the bundle under lease ", lease_id_, " carries ",
                     length, " bytes, which are not a plan for each of its ", members_.size(),
                     " members that fits it", with_bytes ? " followed by their bytes" : "",
                     "; it runs another dlasync, or it does not describe its tensors honestly")));
  }
  if (with_bytes) {
    // A packed header, then its records and bytes.
    remote_detail::packed h;
    const auto* rest = static_cast<const unsigned char*>(data) + plans;
    if (length - plans < sizeof(h)) {
      return fail_locked(absl::DataLossError(
          absl::StrCat("the exporter's grant for the bundle under lease ", lease_id_,
                       " says it carries the members' bytes, and holds none")));
    }
    std::memcpy(&h, rest, sizeof(h));
    return unpack_locked(h, rest + sizeof(h), length - plans - sizeof(h), /*whole=*/true);
  }
  return advance_locked();
}

void remote_import::on_packed_locked(const remote_detail::packed& m, void* data, std::size_t length,
                                     const ucp_am_recv_param_t* param) {
  const ucp_ep_h from = ucx_worker::reply_endpoint(param);
  // Read by RMA: nothing is sent.
  if (endpoint_ == nullptr || from != endpoint_->ep || !bundle_ || rma_ || !hold_requested_ ||
      finished_) {
    return;
  }
  endpoint_->heard_from();
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    return fail_locked(absl::DataLossError(
        absl::StrCat("the exporter sent packed members of lease ", lease_id_,
                     " by rendezvous; packed members come with their message")));
  }
  unpack_locked(m, static_cast<const unsigned char*>(data), length, /*whole=*/false);
}

void remote_import::unpack_locked(const remote_detail::packed& h, const unsigned char* data,
                                  std::size_t length, bool whole) {
  auto refuse = [&](const std::string& why) {
    fail_locked(absl::DataLossError(absl::StrCat("the exporter's packed members of lease ",
                                                 lease_id_, " do not fit the bundle: ", why)));
  };
  constexpr std::size_t entry = sizeof(remote_detail::packed_entry);
  if (h.magic != remote_detail::protocol_magic || h.request_id != request_id_ || h.entries == 0 ||
      h.entries > members_.size() || data == nullptr || length / entry < h.entries ||
      h.bytes != length - h.entries * entry) {
    return refuse(absl::StrCat(h.entries, " members in ", length, " bytes announced as ", h.bytes));
  }
  const unsigned char* from = data + h.entries * entry;
  for (std::uint32_t i = 0; i < h.entries; ++i) {
    remote_detail::packed_entry e;
    std::memcpy(&e, data + i * entry, entry);
    const bool one_piece = e.plan == static_cast<std::uint8_t>(piece_plan::whole) ||
                           e.plan == static_cast<std::uint8_t>(piece_plan::dense);
    if (e.member >= members_.size() || !one_piece || !adopt_plan_locked(e.member, e.plan, 1) ||
        members_[e.member].piece_seen[0]) {
      return refuse(absl::StrCat("member ", e.member, " of kind ", e.plan,
                                 " is not one this import expects packed, or comes twice"));
    }
    member& into = members_[e.member];
    const remote_detail::piece_range expected = into.walk->at(0);
    const auto left = static_cast<std::uint64_t>(data + length - from);
    if (e.length != expected.length || e.length > left || expected.offset != 0 ||
        e.length > into.fetch_bytes) {
      return refuse(absl::StrCat("member ", e.member, " holds ", e.length, " bytes of ", left,
                                 " left; its descriptor says ", expected.length));
    }
    if (e.length > 0) std::memcpy(into.buffer.data(), from, e.length);
    from += e.length;
    into.piece_seen[0] = true;
    ++pieces_done_;
  }
  // The grant's bytes are every member's: nothing else is coming.
  if (whole && pieces_done_ != pieces_expected_) {
    return refuse(absl::StrCat("the grant carries ", pieces_done_, " of ", pieces_expected_,
                               " pieces, and ended the hold"));
  }
  advance_locked();
}

void remote_import::on_received(void* request, ucs_status_t status, std::size_t, void* user_data) {
  ucp_request_free(request);
  static_cast<remote_import*>(user_data)->write_done_locked(status);
}

void remote_import::on_get(void* request, ucs_status_t status, void* user_data) {
  ucp_request_free(request);
  static_cast<remote_import*>(user_data)->write_done_locked(status);
}

void remote_import::write_done_locked(ucs_status_t status) {
  // The last write may hold the last reference.
  std::shared_ptr<remote_import> self = shared_from_this();
  if (writes_in_flight_ > 0) --writes_in_flight_;
  if (status == UCS_OK) {
    ++pieces_done_;
    if (endpoint_ != nullptr) endpoint_->heard_from();
  } else if (failure_.ok()) {
    absl::Status why = remote_detail::ucx_error(
        status, absl::StrCat("fetching lease ", lease_id_,
                             " from its exporter failed; the exporter went away or the transfer "
                             "broke"));
    // A lost peer, whatever UCX calls it, is Unavailable.
    if (why.code() == absl::StatusCode::kDeadlineExceeded ||
        why.code() == absl::StatusCode::kInternal) {
      why = absl::UnavailableError(why.message());
    }
    failure_ = std::move(why);
  }
  if (writes_in_flight_ == 0 && !rma_issuing_) keep_alive_.reset();
  advance_locked();
}

void remote_import::advance_locked() {
  if (finished_) return wind_down_locked();
  if (!failure_.ok()) return fail_locked(failure_);
  if (!hold_granted_ || writes_in_flight_ > 0 || rma_issuing_) return;
  if (!rma_ && (plans_adopted_ < members_.size() || pieces_done_ < pieces_expected_)) return;
  fetched_locked();
}

void remote_import::on_rma_bundle_grant_locked(bool with_bytes, const void* data,
                                               std::size_t length, bool in_place) {
  constexpr std::size_t entry = sizeof(remote_detail::member_plan);
  bool none = !with_bytes && in_place && data != nullptr && length == members_.size() * entry;
  for (std::size_t k = 0; none && k < members_.size(); ++k) {
    remote_detail::member_plan p;
    std::memcpy(&p, static_cast<const unsigned char*>(data) + k * entry, entry);
    none = p.plan == static_cast<std::uint8_t>(piece_plan::none) && p.pieces == 0;
  }
  if (!none) {
    return fail_locked(absl::DataLossError(absl::StrCat(
        "the exporter's grant for the bundle under lease ", lease_id_, " carries ", length,
        " bytes, which are not a plan of none for each of its ", members_.size(),
        " members, read by RMA; it does not speak dlasync's protocol")));
  }
  fetch_rma_locked();
}

absl::StatusOr<ucp_rkey_h> remote_import::key_locked(const std::string& packed) {
  std::shared_ptr<unpacked_key>* cached = endpoint_->keys.find(packed);
  if (cached == nullptr) {
    // Unpacked now that the connection is up: a key is only as good as the
    // endpoint's transports. Between trusted peers only: UCX's parser of
    // keys is not made for hostile bytes.
    ucp_rkey_h handle = nullptr;
    if (ucs_status_t s = ucp_ep_rkey_unpack(endpoint_->ep, packed.data(), &handle); s != UCS_OK) {
      return remote_detail::ucx_error(
          s, "the descriptor's remote key cannot be unpacked; it is corrupt or from another UCX");
    }
    cached = &endpoint_->keys.put(packed, std::make_shared<unpacked_key>(core_->ucx(), handle));
  }
  if (std::find(keys_.begin(), keys_.end(), *cached) == keys_.end()) keys_.push_back(*cached);
  return (*cached)->handle;
}

void remote_import::fetch_rma_locked() {
  keep_alive_ = shared_from_this();
  rma_issuing_ = true;  // held until every get is issued
  for (member& m : members_) {
    const import_plan& p = m.plan.plan;
    if (p.element_count == 0) continue;
    absl::StatusOr<ucp_rkey_h> key = key_locked(m.descriptor.rkey);
    if (!key.ok()) {
      failure_ = key.status();
      break;
    }
    auto* out = static_cast<unsigned char*>(m.buffer.data());
    if (m.lands == layout::span) {
      get_locked(*key, m.plan.span_begin, out, m.fetch_bytes);
    } else if (p.compact) {
      get_locked(*key, p.address, out, m.fetch_bytes);
    } else {
      const remote_detail::piece_walk runs(m.descriptor, m.plan, piece_plan::runs);
      for (std::uint64_t i = 0; i < runs.count() && failure_.ok(); ++i) {
        const remote_detail::piece_range r = runs.at(i);
        get_locked(*key, r.source, out + r.offset, r.length);
      }
    }
    if (!failure_.ok()) break;
  }
  rma_issuing_ = false;
  core_->ucx().progress();
  std::shared_ptr<remote_import> self = shared_from_this();  // before the last hold goes
  if (writes_in_flight_ == 0) keep_alive_.reset();
  advance_locked();
}

void remote_import::get_locked(ucp_rkey_h key, std::uint64_t remote, void* local,
                               std::uint64_t bytes) {
  ++writes_in_flight_;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &remote_import::on_get;
  param.user_data = this;
  ucs_status_ptr_t r = ucp_get_nbx(endpoint_->ep, local, bytes, remote, key, &param);
  if (r == nullptr) return write_done_locked(UCS_OK);
  if (UCS_PTR_IS_ERR(r)) return write_done_locked(UCS_PTR_STATUS(r));
}

}  // namespace dlasync::detail
