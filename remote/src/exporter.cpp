// The exporting side of a remote node: publications (one tensor, or a
// bundle's), their leases and holds, and their producers' release once
// nothing reads their memory. exporter_send.cpp grants the holds and sends
// the bytes.
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asio/post.hpp"
#include "remote/src/remote_core.hpp"

namespace dlasync::detail {

using remote_detail::hold_release;

absl::StatusOr<std::vector<remote_descriptor>> remote_core::publish(
    std::vector<published_member>& members, bool bundle, const publish_options& options) {
  if (listen_address_.empty()) {
    return absl::FailedPreconditionError(
        "this node does not listen (remote_node_options::listen_address is empty), so no "
        "importer could reach a publication; give it an address to listen on");
  }
  std::vector<remote_detail::remote_plan> plans;
  plans.reserve(members.size());
  for (std::size_t i = 0; i < members.size(); ++i) {
    remote_descriptor& d = members[i].description;
    // Fixed since start(): read without the lock.
    d.exporter_address = advertised_address_;
    d.exporter_port = listen_port_;
    absl::StatusOr<remote_detail::remote_plan> plan =
        remote_detail::plan_remote(d, import_options{}, rt_.registry());
    if (!plan.ok()) {
      if (!bundle) return plan.status();
      return remote_detail::for_member(plan.status(), i, members.size());
    }
    plans.push_back(*std::move(plan));
  }

  std::lock_guard lock(ucx_->mutex());
  if (stopping_) {
    return absl::UnavailableError("the remote node is shut down; publish before shutdown");
  }
  std::uint64_t lease = 0;
  do {
    lease = remote_detail::random_u64();
  } while (lease == 0 || publications_.contains(lease) || draining_.contains(lease));

  publication pub;
  pub.lease_id = lease;
  pub.importers = options.importers;
  pub.end = std::chrono::steady_clock::now() + options.lease;
  if (options_.trusted_peers) {
    // Peers trusted with RMA read the members themselves, each under the
    // key of a registration that covers it: a user's, or one made here for
    // the members that share memory.
    std::vector<registration_table::region> regions(members.size());
    for (std::size_t i = 0; i < members.size(); ++i) {
      regions[i].begin = members[i].description.region_begin;
      regions[i].bytes = members[i].description.region_bytes;
    }
    absl::StatusOr<std::vector<std::uint64_t>> ids = registrations_.cover_locked(regions);
    if (!ids.ok()) return ids.status();
    for (std::size_t i = 0; bundle && i < regions.size(); ++i) {
      if (regions[i].key.size() <= remote_bundle::max_key_bytes) continue;
      // No importer could read the bundle back.
      registrations_.release_locked(*ids);
      return remote_detail::for_member(
          absl::OutOfRangeError(
              absl::StrCat("UCX packed its remote key into ", regions[i].key.size(),
                           " bytes, above the ", remote_bundle::max_key_bytes,
                           " a bundle carries; publish it alone, or with fewer UCX transports")),
          i, regions.size());
    }
    pub.registrations = *std::move(ids);
    for (std::size_t i = 0; i < members.size(); ++i) {
      members[i].description.rkey = std::move(regions[i].key);
    }
  }
  std::vector<remote_descriptor> out;
  out.reserve(members.size());
  pub.members.reserve(members.size());
  for (std::size_t i = 0; i < members.size(); ++i) {
    published_member& m = members[i];
    m.description.lease_id = lease;
    m.plan = plans[i];
    m.digest = remote_detail::description_digest(m.description);
    out.push_back(m.description);
    pub.members.push_back(std::move(m));
  }
  pub.timer = std::make_unique<asio::steady_timer>(executor_, pub.end);
  pub.timer->async_wait([weak = weak_from_this(), lease](const asio::error_code& ec) {
    if (ec) return;
    if (std::shared_ptr<remote_core> self = weak.lock()) self->expire(lease);
  });
  publications_.emplace(lease, std::move(pub));
  return out;
}

absl::Status remote_core::when_ended(std::uint64_t lease_id,
                                     std::function<void(publication_end)> callback) {
  if (!callback) {
    return absl::InvalidArgumentError("when_ended was given an empty callback; give it a function");
  }
  std::lock_guard lock(ucx_->mutex());
  auto it = publications_.find(lease_id);
  if (stopping_ || it == publications_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "lease ", lease_id,
        " is not a publication of this node that has not ended (released by its importers, "
        "expired, or never published here); its end has passed already"));
  }
  it->second.on_end.push_back(std::move(callback));
  return absl::OkStatus();
}

absl::StatusOr<std::uint64_t> remote_core::register_memory(std::uint64_t begin,
                                                           std::uint64_t bytes) {
  if (!options_.trusted_peers) {
    return absl::FailedPreconditionError(
        "register_memory: this node does not trust its peers with RMA "
        "(remote_node_options::trusted_peers), and registers nothing; its importers take the "
        "exporter's pieces");
  }
  if (begin == 0 || bytes == 0 || begin + bytes < begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("register_memory: ", bytes, " bytes at 0x", absl::Hex(begin),
                     "; register a non-null address and at least one byte, not past the end of "
                     "the address space"));
  }
  std::lock_guard lock(ucx_->mutex());
  if (stopping_) {
    return absl::UnavailableError("the remote node is shut down; register before shutdown");
  }
  return registrations_.add_user_locked(begin, bytes);
}

void remote_core::unregister_memory(std::uint64_t id) {
  std::lock_guard lock(ucx_->mutex());
  registrations_.remove_user_locked(id);
}

std::size_t remote_core::registrations() const {
  std::lock_guard lock(ucx_->mutex());
  return registrations_.size_locked();
}

std::uint64_t remote_core::registrations_made() const {
  std::lock_guard lock(ucx_->mutex());
  return registrations_.made_locked();
}

std::size_t remote_core::publications() const {
  std::lock_guard lock(ucx_->mutex());
  return publications_.size() + draining_.size();
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
  retire_holders_locked(it->second);
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
  count_release_locked(it);
}

void remote_core::count_release_locked(std::map<std::uint64_t, publication>::iterator it) {
  if (++it->second.releases >= it->second.importers) {
    retire_locked(it, publication_end::released);
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
    retire_locked(it, publication_end::expired);
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

void remote_core::retire_locked(std::map<std::uint64_t, publication>::iterator it,
                                publication_end why) {
  publication& pub = it->second;
  for (auto& f : pub.on_end) ended_.emplace_back([f = std::move(f), why] { f(why); });
  pub.on_end.clear();
  registrations_.release_locked(std::exchange(pub.registrations, {}));
  pub.holds.clear();
  if (pub.reads_in_flight > 0) {
    // The lease's timer stays: at its end, what still reads is cut off.
    draining_.insert(publications_.extract(it));
    return;
  }
  if (pub.timer) pub.timer->cancel();
  retire_holders_locked(pub);
  publications_.erase(it);
}

void remote_core::retire_holders_locked(publication& pub) {
  for (published_member& m : pub.members) retired_.push_back(std::move(m.holder));
  pub.members.clear();
}

void remote_core::drop_retired_locked() {
  if (retired_.empty() && ended_.empty()) return;
  // Producers' deleters, and end callbacks, run on the executor, never under
  // the node's lock.
  to_delete_->add(retired_, ended_);
  asio::post(executor_, [to_delete = to_delete_] { to_delete->drop(); });
}

void retired_producers::add(std::vector<published_holder>& holders,
                            std::vector<std::function<void()>>& ended) {
  std::lock_guard lock(mutex_);
  for (published_holder& h : holders) queued_.push_back(std::move(h));
  holders.clear();
  for (auto& f : ended) ended_.push_back(std::move(f));
  ended.clear();
}

namespace {
// Set while this thread runs producers' deleters in drop(): a deleter that
// shuts a node down (by dropping the last reference to it) must not wait
// for itself.
thread_local bool dropping_here = false;
}  // namespace

void retired_producers::drop() {
  std::unique_lock lock(mutex_);
  while (!queued_.empty() || !ended_.empty()) {
    std::vector<published_holder> now = std::move(queued_);
    queued_.clear();
    std::vector<std::function<void()>> callbacks = std::move(ended_);
    ended_.clear();
    ++dropping_;
    lock.unlock();
    const bool outer = std::exchange(dropping_here, true);
    now.clear();
    for (auto& f : callbacks) {
      try {
        f();
      } catch (...) {  // NOLINT(bugprone-empty-catch): documented: a throw is dropped
      }
    }
    callbacks.clear();
    dropping_here = outer;
    lock.lock();
    --dropping_;
  }
  idle_.notify_all();
}

bool retired_producers::in_drop() noexcept {
  return dropping_here;
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
    if (queued_.empty() && ended_.empty()) return;
  }
}

}  // namespace dlasync::detail
