// The exporting side of a remote node, its sending half: hold requests
// checked and granted, and the pieces that carry each tensor's bytes to
// its importer (cut from the exporter's own record of the tensor, or a
// compact copy the runtime gathers).
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asio/bind_cancellation_slot.hpp"
#include "asio/post.hpp"
#include "dlasync/import.hpp"
#include "dlasync/producer.hpp"
#include "remote/src/remote_core.hpp"

namespace dlasync::detail {

using remote_detail::hold_reply;
using remote_detail::hold_request;
using remote_detail::piece_plan;

// Pieces up to this size are sent eagerly. Measured against UCX's choice
// (dlasync_bench_remote, 3 alternated rounds): 64 KiB imports 1.00 to 1.15
// times as fast over shared memory and 1.18 to 1.38 over TCP; at 256 KiB
// and 1 MiB eager sends were slower over shared memory.
constexpr std::uint64_t eager_piece_bytes = std::uint64_t{64} << 10;
// A grant's bytes go eagerly, in the grant's own message.
static_assert(remote_detail::max_bytes_with_grant <= eager_piece_bytes);

absl::StatusOr<std::vector<std::uint32_t>> remote_core::asked_members(
    const hold_request& m, const publication& pub, const void* members,
    std::size_t members_bytes) const {
  const auto n = static_cast<std::uint32_t>(pub.members.size());
  if ((m.flags & remote_detail::request_members) == 0) {
    if (members_bytes != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a hold request without a member list carries ", members_bytes, " bytes of data"));
    }
    if (n != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lease ", m.lease_id, " is a bundle of ", n,
          " tensors; import it with its remote_bundle (or a selection of its members)"));
    }
    if (m.digest != pub.members[0].digest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the descriptor does not describe the tensor published under lease ", m.lease_id,
          " (its dtype, shape, strides, offset or address were changed); "
          "import the descriptor as the exporter made it"));
    }
    return std::vector<std::uint32_t>{0};
  }
  constexpr std::size_t entry = sizeof(remote_detail::member_request);
  if (members == nullptr || members_bytes == 0 || members_bytes % entry != 0 ||
      members_bytes / entry > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("a bundle's hold request lists ", members_bytes, " bytes of members; lease ",
                     m.lease_id, " holds ", n, " tensor(s), each asked for in ", entry, " bytes"));
  }
  const std::size_t count = members_bytes / entry;
  std::vector<std::uint32_t> asked;
  asked.reserve(count);
  for (std::size_t k = 0; k < count; ++k) {
    remote_detail::member_request r;
    std::memcpy(&r, static_cast<const unsigned char*>(members) + k * entry, entry);
    if (r.index >= n || (k > 0 && r.index <= asked.back()) || r.reserved != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a bundle's hold request asks for member ", r.index, " of lease ", m.lease_id,
          " in place ", k, "; members are asked for once each, in rising order, below ", n));
    }
    if (r.digest != pub.members[r.index].digest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "member ", r.index, " of the bundle does not describe the tensor published under lease ",
          m.lease_id,
          " (its dtype, shape, strides, offset or address were changed); import the bundle as "
          "the exporter made it"));
    }
    asked.push_back(r.index);
  }
  return asked;
}

remote_core::run_range remote_core::sent_runs_locked(ucp_ep_h ep) {
  if (options_.min_run_bytes != 0) return {options_.min_run_bytes, UINT64_MAX};
  // As measured (docs/remote.md): over shared memory, runs sent eagerly
  // beat the gathered copy from 16 KiB; over a network only from 256 KiB,
  // where each piece costs more than the copy saves.
  importer_connection* c = importer_locked(ep);
  std::optional<bool> over_memory = c != nullptr ? c->over_memory : std::nullopt;
  if (!over_memory) {
    over_memory = sends_over_memory(ep);
    if (c != nullptr) c->over_memory = over_memory;
  }
  if (over_memory.value_or(false)) {
    return {remote_detail::default_min_sent_run_bytes_memory, eager_piece_bytes};
  }
  return {remote_detail::default_min_sent_run_bytes_network, UINT64_MAX};
}

void remote_core::on_hold_request_locked(const hold_request& m, const void* members,
                                         std::size_t members_bytes, ucp_ep_h ep) {
  hold_reply r;
  r.request_id = m.request_id;
  auto refuse = [&](absl::StatusCode code, std::string_view message) {
    r.code = static_cast<std::int32_t>(code);
    const std::size_t n = std::min(message.size(), sizeof(r.message) - 1);
    std::memcpy(r.message, message.data(), n);
    r.message[n] = '\0';
    send_locked(ep, remote_detail::am_hold_reply, &r, sizeof(r));
  };
  auto it = publications_.find(m.lease_id);
  const auto now = std::chrono::steady_clock::now();
  if (stopping_) {
    return refuse(absl::StatusCode::kUnavailable, "the exporting node is shutting down");
  }
  if (it == publications_.end()) {
    return refuse(absl::StatusCode::kNotFound,
                  absl::StrCat("lease ", m.lease_id,
                               " is not published here: all its importers released it, it "
                               "expired, or it never existed; ask the exporter to publish again"));
  }
  publication& pub = it->second;
  if (now >= pub.end) {
    return refuse(absl::StatusCode::kDeadlineExceeded,
                  absl::StrCat("lease ", m.lease_id, " has ended; publish with a longer lease"));
  }
  absl::StatusOr<std::vector<std::uint32_t>> asked = asked_members(m, pub, members, members_bytes);
  if (!asked.ok()) return refuse(asked.status().code(), std::string(asked.status().message()));
  const bool listed = (m.flags & remote_detail::request_members) != 0;
  if (m.send_bytes > 1) {
    return refuse(absl::StatusCode::kInvalidArgument, "a hold request's send_bytes is 0 or 1");
  }
  if (m.send_bytes == 0 && !options_.trusted_peers) {
    return refuse(absl::StatusCode::kPermissionDenied,
                  "this exporter does not let importers read its memory (its node does not "
                  "trust its peers with RMA); ask for the bytes instead");
  }
  if (pub.granted >= pub.importers) {
    return refuse(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("lease ", m.lease_id, " was published for ", pub.importers,
                               " importer(s), and all of them have held it; publish with more "
                               "importers"));
  }
  ++pub.granted;
  r.remaining_us = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(pub.end - now).count());
  // How each member asked for is sent, walked once for the grant and the
  // pieces alike. The connection's transport is asked about only for a
  // member that could go run by run.
  std::optional<run_range> runs;
  std::vector<remote_detail::piece_walk> walks;
  walks.reserve(asked->size());
  for (std::uint32_t index : *asked) {
    const published_member& member = pub.members[index];
    piece_plan plan = piece_plan::none;
    if (m.send_bytes != 0) {
      plan = remote_detail::choose_plan(member.description, member.plan, 1);
      if (plan == piece_plan::runs) {
        if (!runs) runs = sent_runs_locked(ep);
        plan = remote_detail::choose_plan(member.description, member.plan, runs->least, runs->most);
      }
    }
    walks.emplace_back(member.description, member.plan, plan);
    r.pieces += walks.back().count();
  }
  if (listed) return grant_bundle_locked(it, r, m, *asked, walks, ep);
  // One tensor: its plan in the grant, and its bytes too when small.
  const remote_detail::piece_walk& walk = walks[0];
  r.plan = static_cast<std::uint8_t>(walk.plan());
  if ((m.flags & remote_detail::request_bytes_with_grant) != 0 && m.send_bytes == 1 &&
      walk.plan() != piece_plan::gathered && walk.count() == 1 &&
      walk.at(0).length <= remote_detail::max_bytes_with_grant) {
    return grant_with_bytes_locked(it, r, walk.at(0), ep);
  }
  grant_hold_locked(pub, r, ep);
  send_locked(ep, remote_detail::am_hold_reply, &r, sizeof(r));
  send_member_locked(pub, 0, 0, m.request_id, ep, walk);
  ucx_->progress();
}

void remote_core::grant_hold_locked(publication& pub, hold_reply& r, ucp_ep_h ep) {
  const std::uint64_t hold_id = ++pub.last_hold;
  const std::uint64_t secret = remote_detail::random_u64();
  pub.holds.emplace(hold_id, hold{secret, ep});
  r.hold_id = hold_id;
  r.secret = secret;
}

namespace {

// Appends `value`'s bytes to `out`.
template <typename T>
void append(std::vector<std::byte>& out, const T& value) {
  const auto* b = reinterpret_cast<const std::byte*>(&value);
  out.insert(out.end(), b, b + sizeof(T));
}

}  // namespace

void remote_core::grant_bundle_locked(std::map<std::uint64_t, publication>::iterator it,
                                      hold_reply& r, const hold_request& m,
                                      const std::vector<std::uint32_t>& asked,
                                      const std::vector<remote_detail::piece_walk>& walks,
                                      ucp_ep_h ep) {
  publication& pub = it->second;
  // Each member's plan, for the grant; and the members of one piece, whole
  // or dense, which can go packed (`sources`: where their bytes are).
  std::vector<remote_detail::member_plan> table(asked.size());
  std::vector<remote_detail::packed_entry> packable;
  std::vector<std::uint64_t> sources;
  std::uint64_t one_piece_bytes = 0;
  bool all_one_piece = true;
  for (std::size_t k = 0; k < asked.size(); ++k) {
    const remote_detail::piece_walk& walk = walks[k];
    table[k].plan = static_cast<std::uint8_t>(walk.plan());
    table[k].pieces = walk.count();
    if (walk.count() == 0) continue;
    if ((walk.plan() != piece_plan::whole && walk.plan() != piece_plan::dense) ||
        walk.count() != 1) {
      all_one_piece = false;
      continue;
    }
    remote_detail::packed_entry e;
    e.member = static_cast<std::uint32_t>(k);
    e.plan = table[k].plan;
    e.length = walk.at(0).length;
    packable.push_back(e);
    sources.push_back(walk.at(0).source);
    one_piece_bytes += e.length;
  }
  // Every member in the grant, as a small single tensor is: one round trip.
  const bool with_bytes = (m.flags & remote_detail::request_bytes_with_grant) != 0 &&
                          all_one_piece && !packable.empty() &&
                          one_piece_bytes <= remote_detail::max_bytes_with_grant;
  if (!with_bytes) {
    // Else only the small members go packed; the others apart.
    std::size_t kept = 0;
    for (std::size_t i = 0; i < packable.size(); ++i) {
      if (packable[i].length > remote_detail::max_packed_piece) continue;
      packable[kept] = packable[i];
      sources[kept] = sources[i];
      ++kept;
    }
    packable.resize(kept);
    sources.resize(kept);
  }
  // Appends the packed message of packable[first, last) to `out`.
  auto pack = [&](std::vector<std::byte>& out, std::size_t first, std::size_t last) {
    remote_detail::packed header;
    header.entries = static_cast<std::uint32_t>(last - first);
    header.request_id = m.request_id;
    for (std::size_t i = first; i < last; ++i) header.bytes += packable[i].length;
    append(out, header);
    for (std::size_t i = first; i < last; ++i) append(out, packable[i]);
    for (std::size_t i = first; i < last; ++i) {
      const std::uintptr_t address = sources[i];
      // NOLINTNEXTLINE(performance-no-int-to-ptr): inside the published tensor
      const auto* from = reinterpret_cast<const std::byte*>(address);
      out.insert(out.end(), from, from + packable[i].length);
    }
  };
  std::vector<std::byte> grant;
  grant.reserve(sizeof(r) + table.size() * sizeof(table[0]) +
                (with_bytes
                     ? sizeof(remote_detail::packed) +
                           packable.size() * sizeof(remote_detail::packed_entry) + one_piece_bytes
                     : 0));
  if (with_bytes) {
    // Every member in the grant: the hold ends with it, no release follows.
    r.flags = remote_detail::reply_bytes_with_grant;
  } else {
    grant_hold_locked(pub, r, ep);
  }
  append(grant, r);
  for (const remote_detail::member_plan& p : table) append(grant, p);
  if (with_bytes) pack(grant, 0, packable.size());
  send_built_locked(ep, remote_detail::am_hold_reply, std::move(grant), sizeof(r));
  if (with_bytes) {
    // The bytes were copied into the message: nothing reads the memory.
    count_release_locked(it);
    ucx_->progress();
    return;
  }
  // The small members, as many to a message as fit; the others apart.
  for (std::size_t first = 0; first < packable.size();) {
    std::size_t last = first;
    std::uint64_t bytes = 0;
    while (last < packable.size() &&
           (last == first || bytes + sizeof(packable[last]) + packable[last].length <=
                                 remote_detail::max_packed_bytes)) {
      bytes += sizeof(packable[last]) + packable[last].length;
      ++last;
    }
    std::vector<std::byte> message;
    message.reserve(sizeof(remote_detail::packed) + bytes);
    pack(message, first, last);
    send_built_locked(ep, remote_detail::am_packed, std::move(message),
                      sizeof(remote_detail::packed));
    first = last;
  }
  std::size_t next_packed = 0;
  for (std::size_t k = 0; k < asked.size(); ++k) {
    if (next_packed < packable.size() && packable[next_packed].member == k) {
      ++next_packed;
      continue;
    }
    send_member_locked(pub, asked[k], static_cast<std::uint32_t>(k), m.request_id, ep, walks[k]);
  }
  ucx_->progress();
}

void remote_core::send_member_locked(publication& pub, std::uint32_t index, std::uint32_t place,
                                     std::uint64_t request_id, ucp_ep_h ep,
                                     const remote_detail::piece_walk& walk) {
  const piece_plan plan = walk.plan();
  if (plan == piece_plan::none) return;  // read by RMA
  if (plan == piece_plan::gathered) {
    return send_gathered_locked(pub, index, place, walk.count(), request_id, ep);
  }
  for (std::uint64_t i = 0; i < walk.count(); ++i) {
    const remote_detail::piece_range range = walk.at(i);
    remote_detail::piece header;
    header.request_id = request_id;
    header.plan = static_cast<std::uint8_t>(plan);
    header.member = place;
    header.index = i;
    header.count = walk.count();
    header.offset = range.offset;
    header.length = range.length;
    send_read_locked(pub, ep, remote_detail::am_piece, &header, sizeof(header), range);
  }
}

void remote_core::grant_with_bytes_locked(std::map<std::uint64_t, publication>::iterator it,
                                          remote_detail::hold_reply& r,
                                          const remote_detail::piece_range& range, ucp_ep_h ep) {
  publication& pub = it->second;
  r.flags = remote_detail::reply_bytes_with_grant;
  send_read_locked(pub, ep, remote_detail::am_hold_reply, &r, sizeof(r), range);
  // The hold ends with the grant: no release follows. Once every importer's
  // hold has ended the publication retires, and its producer goes once no
  // send reads its memory any more (on_read_done_locked; a completion run
  // inside send_am only counts the read down, so `it` still stands).
  count_release_locked(it);
  ucx_->progress();
}

void remote_core::send_with_data_locked(ucp_ep_h ep, unsigned id, const void* header,
                                        std::size_t header_bytes, const void* data,
                                        std::uint64_t length, ucx_worker::send_done done) {
  ucx_worker::am_message sent;
  sent.id = id;
  const auto* h = static_cast<const std::byte*>(header);
  sent.bytes.assign(h, h + header_bytes);
  sent.header_bytes = header_bytes;
  sent.data = data;
  sent.data_bytes = length;
  sent.reply = true;
  // Small pieces go with their message: a rendezvous's extra round trip
  // costs more than copying them through UCX's buffers (docs/remote.md).
  if (length <= eager_piece_bytes) sent.carried_by = ucx_worker::am_message::protocol::eager;
  (void)ucx_->send_am(ep, std::move(sent), std::move(done));
}

void remote_core::send_read_locked(publication& pub, ucp_ep_h ep, unsigned id, const void* header,
                                   std::size_t header_bytes,
                                   const remote_detail::piece_range& range) {
  ++pub.reads_in_flight;
  ++pub.readers[ep];
  // NOLINTNEXTLINE(performance-no-int-to-ptr): inside the published tensor
  const void* data = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(range.source));
  send_with_data_locked(
      ep, id, header, header_bytes, data, range.length,
      [this, lease = pub.lease_id, ep](ucs_status_t) { on_read_done_locked(lease, ep); });
}

void remote_core::send_refusal_locked(const gather_target& to, absl::StatusCode code) {
  remote_detail::piece header;
  header.code = static_cast<std::int32_t>(code);
  header.request_id = to.request_id;
  header.plan = static_cast<std::uint8_t>(piece_plan::gathered);
  header.member = to.place;
  header.count = to.pieces;
  send_locked(to.ep, remote_detail::am_piece, &header, sizeof(header));
}

void remote_core::send_gathered_locked(publication& pub, std::uint32_t index, std::uint32_t place,
                                       std::uint64_t pieces, std::uint64_t request_id,
                                       ucp_ep_h ep) {
  // The runtime compacts the tensor (the strided copy kernels, on its
  // workers, within its copy budget); the copy goes in pieces of
  // max_piece_bytes, all in flight together, each a sign of life. Only the
  // tensor's elements leave, never the gaps between them.
  ++pub.reads_in_flight;
  const published_member& member = pub.members[index];
  const remote_descriptor& d = member.description;
  tensor_description view;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the published tensor's own memory
  view.data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(d.data));
  view.device = d.source_device;
  view.dtype = d.type;
  view.shape = d.shape;
  view.strides = d.strides;
  view.byte_offset = d.byte_offset;
  const gather_target to{.lease = pub.lease_id,
                         .bytes = member.plan.plan.byte_size,
                         .pieces = pieces,
                         .request_id = request_id,
                         .place = place,
                         .ep = ep};
  // Started on the executor, not under the node's lock: a small copy runs
  // inside the call.
  asio::post(executor_, [self = shared_from_this(), view = std::move(view), to]() mutable {
    self->gather(std::move(view), to);
  });
}

void remote_core::gather(tensor_description view, gather_target to) {
  std::unique_lock lock(ucx_->mutex());
  if (stopping_) return on_read_done_locked(to.lease);  // the memory may be gone already
  std::lock_guard gathers_lock(gathers_mutex_);
  auto g = gathers_.emplace(gathers_.end());
  lock.unlock();  // shutdown now finds the gather, and waits for it
  managed_tensor source = make_managed_tensor(std::move(view));  // the publication keeps it
  import_options o;
  o.target = host_device;
  o.copy = true;
  o.require_contiguous = true;
  auto done = [self = shared_from_this(), g, to](absl::StatusOr<tensor> t) {
    std::lock_guard lock(self->ucx_->mutex());
    {
      std::lock_guard gathers(self->gathers_mutex_);
      self->gathers_.erase(g);
      self->gathers_done_.notify_all();
    }
    self->on_read_done_locked(to.lease);
    if (self->stopping_ || self->importer_locked(to.ep) == nullptr) return;
    if (!t.ok()) return self->send_refusal_locked(to, t.status().code());
    // The copy lives until its last piece's send no longer reads it.
    auto copy = std::make_shared<tensor>(*std::move(t));
    const auto* bytes = static_cast<const unsigned char*>(copy->data());
    for (std::uint64_t i = 0; i < to.pieces; ++i) {
      const std::uint64_t offset = i * remote_detail::max_piece_bytes;
      remote_detail::piece header;
      header.request_id = to.request_id;
      header.plan = static_cast<std::uint8_t>(piece_plan::gathered);
      header.member = to.place;
      header.index = i;
      header.count = to.pieces;
      header.offset = offset;
      header.length = std::min(remote_detail::max_piece_bytes, to.bytes - offset);
      self->send_with_data_locked(to.ep, remote_detail::am_piece, &header, sizeof(header),
                                  bytes + offset, header.length,
                                  [copy](ucs_status_t) mutable { copy.reset(); });
    }
    self->ucx_->progress();
  };
  // Under gathers_mutex_: shutdown cancels through the slot.
  async_import_dlpack(rt_, source, o, asio::bind_cancellation_slot(g->slot(), std::move(done)));
}

void remote_core::cancel_gathers_locked() {
  std::lock_guard gathers(gathers_mutex_);
  for (asio::cancellation_signal& g : gathers_) g.emit(asio::cancellation_type::terminal);
}

void remote_core::wait_for_gathers() {
  std::unique_lock gathers(gathers_mutex_);
  gathers_done_.wait(gathers, [this] { return gathers_.empty(); });
}

}  // namespace dlasync::detail
