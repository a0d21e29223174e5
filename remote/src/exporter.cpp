// The exporting side of a remote node: publications and their leases.
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "asio/post.hpp"
#include "remote/src/remote_core.hpp"

namespace dlasync::detail {
namespace {

// splitmix64: lease ids that do not repeat and are not guessable from each
// other.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

using remote_detail::hold_release;
using remote_detail::hold_reply;
using remote_detail::hold_request;

absl::StatusOr<remote_descriptor> remote_core::publish(published_holder& holder,
                                                       remote_descriptor d,
                                                       const publish_options& options) {
  std::lock_guard lock(ucx_->mutex());
  if (stopping_) {
    return absl::UnavailableError("the remote node is shut down; publish before shutdown");
  }
  std::uint64_t lease = 0;
  do {
    lease = mix(lease_seed_ + ++last_lease_);
  } while (lease == 0 || publications_.contains(lease));
  d.lease_id = lease;
  d.worker_address = ucx_->address();

  publication pub;
  pub.lease_id = lease;
  pub.importers = options.importers;
  pub.end = std::chrono::steady_clock::now() + options.lease;
  if (d.region_bytes > 0) {
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
  pub.region_begin = d.region_begin;
  pub.region_bytes = d.region_bytes;
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

void remote_core::on_hold_request_locked(const hold_request& m, ucp_ep_h reply_ep) {
  hold_reply r;
  r.request_id = m.request_id;
  auto refuse = [&r](absl::StatusCode code, const std::string& message) {
    r.code = static_cast<std::int32_t>(code);
    const std::size_t n = std::min(message.size(), sizeof(r.message) - 1);
    std::memcpy(r.message, message.data(), n);
    r.message[n] = '\0';
  };
  auto it = publications_.find(m.lease_id);
  const auto now = std::chrono::steady_clock::now();
  if (stopping_) {
    refuse(absl::StatusCode::kUnavailable, "the exporting node is shutting down");
  } else if (it == publications_.end()) {
    refuse(absl::StatusCode::kNotFound,
           absl::StrCat("lease ", m.lease_id,
                        " is not published here: all its importers released it, it expired, "
                        "or it never existed; ask the exporter to publish again"));
  } else if (now >= it->second.end) {
    refuse(absl::StatusCode::kDeadlineExceeded,
           absl::StrCat("lease ", m.lease_id, " has ended; publish with a longer lease"));
  } else if (it->second.holds >= it->second.importers) {
    refuse(absl::StatusCode::kFailedPrecondition,
           absl::StrCat("lease ", m.lease_id, " was published for ", it->second.importers,
                        " importer(s), and all of them hold it; publish with more importers"));
  } else {
    ++it->second.holds;
    r.remaining_us = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(it->second.end - now).count());
  }
  send_locked(reply_ep, remote_detail::am_hold_reply, &r, sizeof(r), false);
}

void remote_core::on_hold_release_locked(const hold_release& m) {
  auto it = publications_.find(m.lease_id);
  if (it == publications_.end()) return;
  publication& pub = it->second;
  // A release without a hold is not counted.
  if (pub.releases >= pub.holds) return;
  if (++pub.releases >= pub.importers) {
    retire_locked(it);
    drop_retired_locked();
  }
}

void remote_core::expire(std::uint64_t lease_id) {
  std::lock_guard lock(ucx_->mutex());
  auto it = publications_.find(lease_id);
  if (it == publications_.end()) return;
  retire_locked(it);
  drop_retired_locked();
}

void remote_core::retire_locked(std::map<std::uint64_t, publication>::iterator it) {
  publication& pub = it->second;
  if (pub.memh != nullptr) ucp_mem_unmap(ucx_->context(), std::exchange(pub.memh, nullptr));
  if (pub.timer) pub.timer->cancel();
  if (pub.sends_in_flight > 0) {
    draining_.insert(publications_.extract(it));
    return;
  }
  retired_.push_back(std::move(pub.holder));
  publications_.erase(it);
}

void remote_core::on_fetch_request_locked(const remote_detail::fetch_request& m,
                                          ucp_ep_h reply_ep) {
  auto refuse = [&](absl::StatusCode code) {
    remote_detail::fetch_data r;
    r.code = static_cast<std::int32_t>(code);
    r.request_id = m.request_id;
    r.piece = m.piece;
    send_locked(reply_ep, remote_detail::am_fetch_data, &r, sizeof(r), false);
  };
  auto it = publications_.find(m.lease_id);
  if (stopping_ || it == publications_.end()) return refuse(absl::StatusCode::kNotFound);
  publication& pub = it->second;
  // Only under a hold, and only inside the registered region.
  std::uint64_t end = 0;
  if (pub.holds <= pub.releases || m.address < pub.region_begin ||
      __builtin_add_overflow(m.address, m.length, &end) ||
      end > pub.region_begin + pub.region_bytes) {
    return refuse(absl::StatusCode::kPermissionDenied);
  }
  remote_detail::fetch_data header;
  header.request_id = m.request_id;
  header.piece = m.piece;
  header.length = m.length;
  ucx_worker::am_message sent;
  sent.id = remote_detail::am_fetch_data;
  const auto* h = reinterpret_cast<const std::byte*>(&header);
  sent.bytes.assign(h, h + sizeof(header));
  sent.header_bytes = sizeof(header);
  // NOLINTNEXTLINE(performance-no-int-to-ptr): inside the published region
  sent.data = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(m.address));
  sent.data_bytes = m.length;
  ++pub.sends_in_flight;
  // The publication's memory stays until the send is over (or the worker
  // ends it at shutdown).
  (void)ucx_->send_am(reply_ep, std::move(sent),
                      [this, lease = m.lease_id](ucs_status_t) { on_fetch_sent_locked(lease); });
}

void remote_core::on_fetch_sent_locked(std::uint64_t lease_id) {
  if (auto it = publications_.find(lease_id); it != publications_.end()) {
    --it->second.sends_in_flight;
    return;
  }
  auto it = draining_.find(lease_id);
  if (it == draining_.end() || --it->second.sends_in_flight > 0) return;
  retired_.push_back(std::move(it->second.holder));
  draining_.erase(it);
  drop_retired_locked();
}

void remote_core::drop_retired_locked() {
  if (retired_.empty()) return;
  // Producers' deleters run on the executor, never under the node's lock.
  asio::post(executor_, [dropped = std::move(retired_)]() mutable { dropped.clear(); });
  retired_.clear();
}

}  // namespace dlasync::detail
