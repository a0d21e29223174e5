// The exporting side of a remote node: publications, their leases and
// holds, and the pieces that carry a tensor's bytes to its importers.
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "asio/bind_cancellation_slot.hpp"
#include "asio/post.hpp"
#include "dlasync/import.hpp"
#include "dlasync/producer.hpp"
#include "remote/src/remote_core.hpp"

namespace dlasync::detail {

using remote_detail::hold_release;
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

absl::StatusOr<remote_descriptor> remote_core::publish(published_holder& holder,
                                                       remote_descriptor d,
                                                       const publish_options& options) {
  if (listen_address_.empty()) {
    return absl::FailedPreconditionError(
        "this node does not listen (remote_node_options::listen_address is empty), so no "
        "importer could reach a publication; give it an address to listen on");
  }
  // Fixed since start(): read without the lock.
  d.exporter_address = listen_address_;
  d.exporter_port = listen_port_;
  absl::StatusOr<remote_detail::remote_plan> plan =
      remote_detail::plan_remote(d, import_options{}, rt_.registry());
  if (!plan.ok()) return plan.status();

  std::lock_guard lock(ucx_->mutex());
  if (stopping_) {
    return absl::UnavailableError("the remote node is shut down; publish before shutdown");
  }
  std::uint64_t lease = 0;
  do {
    lease = remote_detail::random_u64();
  } while (lease == 0 || publications_.contains(lease) || draining_.contains(lease));
  d.lease_id = lease;

  publication pub;
  pub.lease_id = lease;
  pub.importers = options.importers;
  pub.end = std::chrono::steady_clock::now() + options.lease;
  if (options_.trusted_peers && d.region_bytes > 0) {
    // Peers trusted with RMA read the region themselves, by its key.
    ucp_mem_map_params_t p{};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    // NOLINTNEXTLINE(performance-no-int-to-ptr): the tensor's own memory
    p.address = reinterpret_cast<void*>(static_cast<std::uintptr_t>(d.region_begin));
    p.length = d.region_bytes;
    if (ucs_status_t s = ucp_mem_map(ucx_->context(), &p, &pub.memh); s != UCS_OK) {
      return remote_detail::ucx_error(
          s, absl::StrCat("UCX could not register the tensor's ", d.region_bytes, " bytes"));
    }
    void* packed = nullptr;
    std::size_t packed_size = 0;
    if (ucs_status_t s = ucp_rkey_pack(ucx_->context(), pub.memh, &packed, &packed_size);
        s != UCS_OK) {
      ucp_mem_unmap(ucx_->context(), pub.memh);
      return remote_detail::ucx_error(s, "UCX could not pack the remote key");
    }
    d.rkey.assign(static_cast<const char*>(packed), packed_size);
    ucp_rkey_buffer_release(packed);
  }
  pub.description = d;
  pub.plan = *std::move(plan);
  pub.digest = remote_detail::description_digest(d);
  pub.holder = std::move(holder);
  pub.timer = std::make_unique<asio::steady_timer>(executor_, pub.end);
  pub.timer->async_wait([weak = weak_from_this(), lease](const asio::error_code& ec) {
    if (ec) return;
    if (std::shared_ptr<remote_core> self = weak.lock()) self->expire(lease);
  });
  publications_.emplace(lease, std::move(pub));
  return d;
}

std::size_t remote_core::publications() const {
  std::lock_guard lock(ucx_->mutex());
  return publications_.size() + draining_.size();
}

void remote_core::on_hold_request_locked(const hold_request& m, ucp_ep_h ep) {
  hold_reply r;
  r.request_id = m.request_id;
  auto refuse = [&](absl::StatusCode code, const std::string& message) {
    r.code = static_cast<std::int32_t>(code);
    const std::size_t n = std::min(message.size(), sizeof(r.message) - 1);
    std::memcpy(r.message, message.data(), n);
    r.message[n] = '\0';
    send_locked(ep, remote_detail::am_hold_reply, &r, sizeof(r), true);
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
  if (m.digest != pub.digest) {
    return refuse(absl::StatusCode::kInvalidArgument,
                  absl::StrCat("the descriptor does not describe the tensor published under lease ",
                               m.lease_id,
                               " (its dtype, shape, strides, offset or address were changed); "
                               "import the descriptor as the exporter made it"));
  }
  if (m.send_bytes > 1) {
    return refuse(absl::StatusCode::kInvalidArgument, "a hold request's send_bytes is 0 or 1");
  }
  if (m.send_bytes == 0 && (!options_.trusted_peers || pub.memh == nullptr)) {
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
  const piece_plan plan = m.send_bytes != 0 ? remote_detail::choose_plan(
                                                  pub.description, pub.plan,
                                                  options_.min_run_bytes != 0
                                                      ? options_.min_run_bytes
                                                      : remote_detail::default_min_sent_run_bytes)
                                            : piece_plan::none;
  const remote_detail::piece_walk walk(pub.description, pub.plan, plan);
  r.remaining_us = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(pub.end - now).count());
  r.plan = static_cast<std::uint8_t>(plan);
  r.pieces = walk.count();
  if ((m.flags & remote_detail::request_bytes_with_grant) != 0 && m.send_bytes == 1 &&
      plan != piece_plan::gathered && walk.count() == 1 &&
      walk.at(0).length <= remote_detail::max_bytes_with_grant) {
    return grant_with_bytes_locked(it, r, walk.at(0), ep);
  }
  const std::uint64_t hold_id = ++pub.last_hold;
  const std::uint64_t secret = remote_detail::random_u64();
  pub.holds.emplace(hold_id, hold{secret, ep});
  r.hold_id = hold_id;
  r.secret = secret;
  send_locked(ep, remote_detail::am_hold_reply, &r, sizeof(r), true);
  if (plan == piece_plan::gathered) return send_gathered_locked(pub, m.request_id, ep);
  for (std::uint64_t i = 0; i < walk.count(); ++i) {
    const remote_detail::piece_range range = walk.at(i);
    remote_detail::piece header;
    header.request_id = m.request_id;
    header.plan = static_cast<std::uint8_t>(plan);
    header.index = i;
    header.count = walk.count();
    header.offset = range.offset;
    header.length = range.length;
    send_read_locked(pub, ep, remote_detail::am_piece, &header, sizeof(header), range);
  }
  ucx_->progress();
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
  if (++pub.releases >= pub.importers) {
    retire_locked(it);
    drop_retired_locked();
  }
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

void remote_core::send_refusal_locked(ucp_ep_h ep, std::uint64_t request_id, piece_plan plan,
                                      std::uint64_t count, absl::StatusCode code) {
  remote_detail::piece header;
  header.code = static_cast<std::int32_t>(code);
  header.request_id = request_id;
  header.plan = static_cast<std::uint8_t>(plan);
  header.count = count;
  send_locked(ep, remote_detail::am_piece, &header, sizeof(header), true);
}

void remote_core::send_gathered_locked(publication& pub, std::uint64_t request_id, ucp_ep_h ep) {
  // The runtime compacts the tensor (the strided copy kernels, on its
  // workers, within its copy budget); the copy goes as one piece. Only
  // the tensor's elements leave, never the gaps between them.
  ++pub.reads_in_flight;
  const remote_descriptor& d = pub.description;
  tensor_description view;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): the published tensor's own memory
  view.data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(d.data));
  view.device = d.source_device;
  view.dtype = d.type;
  view.shape = d.shape;
  view.strides = d.strides;
  view.byte_offset = d.byte_offset;
  const std::uint64_t lease = pub.lease_id;
  const std::uint64_t bytes = pub.plan.plan.byte_size;
  // Started on the executor, not under the node's lock: a small copy runs
  // inside the call.
  asio::post(executor_,
             [self = shared_from_this(), view = std::move(view), lease, bytes, request_id,
              ep]() mutable { self->gather(std::move(view), lease, bytes, request_id, ep); });
}

void remote_core::gather(tensor_description view, std::uint64_t lease, std::uint64_t bytes,
                         std::uint64_t request_id, ucp_ep_h ep) {
  std::unique_lock lock(ucx_->mutex());
  if (stopping_) return on_read_done_locked(lease);  // the memory may be gone already
  std::lock_guard gathers_lock(gathers_mutex_);
  auto g = gathers_.emplace(gathers_.end());
  lock.unlock();  // shutdown now finds the gather, and waits for it
  managed_tensor source = make_managed_tensor(std::move(view));  // the publication keeps it
  import_options o;
  o.target = host_device;
  o.copy = true;
  o.require_contiguous = true;
  auto done = [self = shared_from_this(), g, lease, bytes, request_id,
               ep](absl::StatusOr<tensor> t) {
    std::lock_guard lock(self->ucx_->mutex());
    {
      std::lock_guard gathers(self->gathers_mutex_);
      self->gathers_.erase(g);
      self->gathers_done_.notify_all();
    }
    self->on_read_done_locked(lease);
    if (self->stopping_ || self->importer_locked(ep) == nullptr) return;
    if (!t.ok()) {
      return self->send_refusal_locked(ep, request_id, piece_plan::gathered, 1, t.status().code());
    }
    remote_detail::piece header;
    header.request_id = request_id;
    header.plan = static_cast<std::uint8_t>(piece_plan::gathered);
    header.count = 1;
    header.length = bytes;
    auto copy = std::make_shared<tensor>(*std::move(t));
    const void* data = copy->data();
    self->send_with_data_locked(ep, remote_detail::am_piece, &header, sizeof(header), data, bytes,
                                [copy](ucs_status_t) mutable { copy.reset(); });
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

void remote_core::on_read_done_locked(std::uint64_t lease_id, ucp_ep_h ep) {
  auto done = [ep](publication& pub) {
    --pub.reads_in_flight;
    if (ep == nullptr) return;
    if (auto r = pub.readers.find(ep); r != pub.readers.end() && --r->second == 0) {
      pub.readers.erase(r);
    }
  };
  if (auto it = publications_.find(lease_id); it != publications_.end()) {
    done(it->second);
    return;
  }
  auto it = draining_.find(lease_id);
  if (it == draining_.end()) return;
  done(it->second);
  if (it->second.reads_in_flight > 0) return;
  if (it->second.timer) it->second.timer->cancel();
  retired_.push_back(std::move(it->second.holder));
  draining_.erase(it);
  drop_retired_locked();
}

void remote_core::close_importer_locked(ucp_ep_h ep) {
  if (importers_.erase(ep) == 0) return;
  drop_importer_locked(ep);
  ucx_->close_endpoint(ep);  // its sends end, their reads with them
}

void remote_core::on_hold_release_locked(const hold_release& m, ucp_ep_h ep) {
  auto it = publications_.find(m.lease_id);
  if (it == publications_.end()) return;
  auto h = it->second.holds.find(m.hold_id);
  // Only the holder ends its hold: the secret it was granted, on the
  // connection it was granted on.
  if (h == it->second.holds.end() || h->second.secret != m.secret || h->second.ep != ep) return;
  release_hold_locked(it, h);
}

void remote_core::release_hold_locked(std::map<std::uint64_t, publication>::iterator it,
                                      std::map<std::uint64_t, hold>::iterator h) {
  publication& pub = it->second;
  pub.holds.erase(h);
  if (++pub.releases >= pub.importers) {
    retire_locked(it);
    drop_retired_locked();
  }
}

void remote_core::drop_importer_locked(ucp_ep_h ep) {
  // A holder that went away without releasing: its hold ends as a release
  // would end it.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ended;
  for (auto& [lease, pub] : publications_) {
    for (auto& [id, h] : pub.holds) {
      if (h.ep == ep) ended.emplace_back(lease, id);
    }
  }
  for (const auto& [lease, id] : ended) {
    auto it = publications_.find(lease);
    if (it == publications_.end()) continue;
    auto h = it->second.holds.find(id);
    if (h != it->second.holds.end()) release_hold_locked(it, h);
  }
}

void remote_core::expire(std::uint64_t lease_id) {
  std::lock_guard lock(ucx_->mutex());
  if (stopping_) return;
  if (auto it = publications_.find(lease_id); it != publications_.end()) {
    retire_locked(it);
    drop_retired_locked();
  }
  // The lease is over, and sends still read its memory: the importers
  // behind them (stalled, or slow past the lease) are cut off, which ends
  // the sends, and the producer goes.
  auto it = draining_.find(lease_id);
  if (it == draining_.end()) return;
  std::vector<ucp_ep_h> readers;
  for (const auto& [ep, n] : it->second.readers) readers.push_back(ep);
  for (ucp_ep_h ep : readers) close_importer_locked(ep);
}

void remote_core::retire_locked(std::map<std::uint64_t, publication>::iterator it) {
  publication& pub = it->second;
  if (pub.memh != nullptr) ucp_mem_unmap(ucx_->context(), std::exchange(pub.memh, nullptr));
  pub.holds.clear();
  if (pub.reads_in_flight > 0) {
    // The lease's timer stays: at its end, what still reads is cut off.
    draining_.insert(publications_.extract(it));
    return;
  }
  if (pub.timer) pub.timer->cancel();
  retired_.push_back(std::move(pub.holder));
  publications_.erase(it);
}

void remote_core::drop_retired_locked() {
  if (retired_.empty()) return;
  // Producers' deleters run on the executor, never under the node's lock.
  to_delete_->add(retired_);
  asio::post(executor_, [to_delete = to_delete_] { to_delete->drop(); });
}

void retired_producers::add(std::vector<published_holder>& holders) {
  std::lock_guard lock(mutex_);
  for (published_holder& h : holders) queued_.push_back(std::move(h));
  holders.clear();
}

namespace {
// Set while this thread runs producers' deleters in drop(): a deleter that
// shuts a node down (by dropping the last reference to it) must not wait
// for itself.
thread_local bool dropping_here = false;
}  // namespace

void retired_producers::drop() {
  std::unique_lock lock(mutex_);
  while (!queued_.empty()) {
    std::vector<published_holder> now = std::move(queued_);
    queued_.clear();
    ++dropping_;
    lock.unlock();
    const bool outer = std::exchange(dropping_here, true);
    now.clear();
    dropping_here = outer;
    lock.lock();
    --dropping_;
  }
  idle_.notify_all();
}

void retired_producers::drop_all() {
  if (dropping_here) {
    // Called from a deleter: what is queued is dropped here, and the drop
    // under way is this thread's own, which ends when the deleter returns.
    drop();
    return;
  }
  for (;;) {
    drop();
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return dropping_ == 0; });
    if (queued_.empty()) return;
  }
}

}  // namespace dlasync::detail
