#include "remote/src/remote_core.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "asio/post.hpp"
#include "remote/src/numeric_address.hpp"
#include "remote/src/remote_import.hpp"

namespace dlasync::detail {
namespace {

template <typename Message>
bool read_message(const void* header, std::size_t length, Message& m) {
  if (length != sizeof(Message)) return false;
  std::memcpy(&m, header, sizeof(m));
  if (m.magic != remote_detail::protocol_magic) return false;
  if constexpr (requires { m.version; }) {
    if (m.version != remote_detail::protocol_version) return false;
  }
  return true;
}

}  // namespace

namespace {

// UCX's report of the lanes of `ep` (ucp_ep_print_info's text).
std::string lane_report(ucp_ep_h ep) {
  char* text = nullptr;
  std::size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return {};
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  std::string report(text, size);
  std::free(text);  // NOLINT(cppcoreguidelines-no-malloc): open_memstream's buffer
  return report;
}

}  // namespace

bool remote_core::native_rma(ucp_ep_h ep) {
  // UCX chose a lane of its own for RMA on `ep` ("rma_bw#" in its lane
  // report): a native one, as cma over shared memory.
  return lane_report(ep).find("rma_bw#") != std::string::npos;
}

std::optional<bool> remote_core::sends_over_memory(ucp_ep_h ep) {
  // The lanes of its bulk active messages ("am_bw#"), one per line, each
  // naming its transport and device ("sysv/memory", "tcp/eth0").
  bool any = false;
  for (absl::string_view line : absl::StrSplit(lane_report(ep), '\n')) {
    if (!absl::StrContains(line, "am_bw#")) continue;
    any = true;
    if (!absl::StrContains(line, "/memory")) return false;
  }
  if (!any) return std::nullopt;
  return true;
}

remote_core::remote_core(runtime& rt, remote_node_options options, std::shared_ptr<ucx_worker> ucx)
    : rt_(rt),
      options_(std::move(options)),
      ucx_(std::move(ucx)),
      executor_(rt.get_executor()),
      registrations_(ucx_->context()) {}

remote_core::~remote_core() {
  shutdown();
}

absl::Status remote_core::start() {
  {
    std::lock_guard lock(ucx_->mutex());
    const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
        {remote_detail::am_hold_request, &remote_core::on_am_request},
        {remote_detail::am_hold_reply, &remote_core::on_am_reply},
        {remote_detail::am_hold_release, &remote_core::on_am_release},
        {remote_detail::am_piece, &remote_core::on_am_piece},
        {remote_detail::am_packed, &remote_core::on_am_packed},
    };
    for (const auto& [id, cb] : handlers) {
      if (absl::Status s = ucx_->set_am_handler(id, cb, this); !s.ok()) return s;
    }
    if (!options_.listen_address.empty()) {
      absl::StatusOr<std::uint16_t> port = ucx_->listen(
          options_.listen_address, options_.listen_port, &remote_core::on_connection_request, this);
      if (!port.ok()) {
        return absl::Status(port.status().code(),
                            absl::StrCat("remote_node_options::listen_address = \"",
                                         options_.listen_address, "\", listen_port = ",
                                         options_.listen_port, ": ", port.status().message()));
      }
      listen_address_ = options_.listen_address;
      // Spelled as a decoded descriptor spells it, so that a descriptor
      // compares equal after a round trip.
      advertised_address_ = remote_detail::canonical_address(options_.advertised_address.empty()
                                                                 ? options_.listen_address
                                                                 : options_.advertised_address);
      listen_port_ = *port;
    }
  }
  ucx_->start();
  return absl::OkStatus();
}

void remote_core::on_connection_request(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<remote_core*>(arg);
  if (self->stopping_ || self->importers_.size() >= self->options_.max_connections) {
    self->ucx_->reject(request);
    return;
  }
  absl::StatusOr<ucp_ep_h> ep = self->ucx_->accept(request, &remote_core::on_importer_error, self);
  if (!ep.ok()) return;
  auto c = std::make_unique<importer_connection>();
  c->core = self;
  c->ep = *ep;
  self->importers_.emplace(*ep, std::move(c));
}

importer_connection* remote_core::importer_locked(ucp_ep_h ep) {
  if (ep == nullptr) return nullptr;
  auto it = importers_.find(ep);
  return it == importers_.end() ? nullptr : it->second.get();
}

void remote_core::on_importer_error(void* arg, ucp_ep_h ep, ucs_status_t) {
  auto* self = static_cast<remote_core*>(arg);
  if (self->importers_.erase(ep) == 0) return;
  self->drop_importer_locked(ep);
  // Closed outside UCX's callback.
  asio::post(self->executor_, [weak = self->weak_from_this(), ep] {
    std::shared_ptr<remote_core> core = weak.lock();
    if (core == nullptr) return;
    std::lock_guard lock(core->ucx_->mutex());
    if (!core->stopping_) core->ucx_->close_endpoint(ep);
  });
}

ucs_status_t remote_core::on_am_request(void* arg, const void* header, std::size_t length,
                                        void* data, std::size_t data_length,
                                        const ucp_am_recv_param_t* param) {
  auto* self = static_cast<remote_core*>(arg);
  remote_detail::hold_request m;
  if (!read_message(header, length, m)) return UCS_OK;  // not ours: dropped
  ucp_ep_h ep = ucx_worker::reply_endpoint(param);
  if (self->importer_locked(ep) == nullptr) return UCS_OK;  // not through the listener
  // A member list comes with its message; one that UCX would fetch by
  // rendezvous is not read (UCX completes it for its sender as dropped),
  // and the request is refused.
  const bool in_place = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0;
  self->on_hold_request_locked(m, in_place ? data : nullptr, data_length, ep);
  return UCS_OK;
}

ucs_status_t remote_core::on_am_release(void* arg, const void* header, std::size_t length, void*,
                                        std::size_t, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<remote_core*>(arg);
  remote_detail::hold_release m;
  if (!read_message(header, length, m)) return UCS_OK;
  ucp_ep_h ep = ucx_worker::reply_endpoint(param);
  if (self->importer_locked(ep) == nullptr) return UCS_OK;
  self->on_hold_release_locked(m, ep);
  return UCS_OK;
}

ucs_status_t remote_core::on_am_reply(void* arg, const void* header, std::size_t length, void* data,
                                      std::size_t data_length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<remote_core*>(arg);
  remote_detail::hold_reply m;
  if (!read_message(header, length, m)) return UCS_OK;
  auto it = self->imports_.find(m.request_id);
  // Late, or not ours (a rendezvous is completed for its sender as dropped).
  if (it == self->imports_.end()) return UCS_OK;
  std::shared_ptr<remote_import> op = it->second;
  op->on_hold_reply_locked(m, data, data_length, param);
  return UCS_OK;
}

ucs_status_t remote_core::on_am_piece(void* arg, const void* header, std::size_t length, void* data,
                                      std::size_t data_length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<remote_core*>(arg);
  remote_detail::piece m;
  if (!read_message(header, length, m)) return UCS_OK;
  auto it = self->imports_.find(m.request_id);
  // Not ours, or late: UCX completes the sender's rendezvous when the
  // handler returns without receiving it.
  if (it == self->imports_.end()) return UCS_OK;
  std::shared_ptr<remote_import> op = it->second;
  op->on_piece_locked(m, data, data_length, param);
  return UCS_OK;
}

ucs_status_t remote_core::on_am_packed(void* arg, const void* header, std::size_t length,
                                       void* data, std::size_t data_length,
                                       const ucp_am_recv_param_t* param) {
  auto* self = static_cast<remote_core*>(arg);
  remote_detail::packed m;
  if (!read_message(header, length, m)) return UCS_OK;
  auto it = self->imports_.find(m.request_id);
  if (it == self->imports_.end()) return UCS_OK;
  std::shared_ptr<remote_import> op = it->second;
  op->on_packed_locked(m, data, data_length, param);
  return UCS_OK;
}

void remote_core::send_locked(ucp_ep_h ep, unsigned id, const void* header, std::size_t length,
                              std::string_view data) {
  std::vector<std::byte> bytes;
  bytes.reserve(length + data.size());
  const auto* h = static_cast<const std::byte*>(header);
  bytes.assign(h, h + length);
  const auto* more = reinterpret_cast<const std::byte*>(data.data());
  bytes.insert(bytes.end(), more, more + data.size());
  send_built_locked(ep, id, std::move(bytes), length);
}

void remote_core::send_built_locked(ucp_ep_h ep, unsigned id, std::vector<std::byte> bytes,
                                    std::size_t header_bytes) {
  ucx_worker::am_message m;
  m.id = id;
  m.bytes = std::move(bytes);
  m.header_bytes = header_bytes;
  m.reply = true;
  m.carried_by = ucx_worker::am_message::protocol::eager;
  (void)ucx_->send_am(ep, std::move(m));
}

absl::StatusOr<exporter_endpoint*> remote_core::endpoint_locked(const std::string& address,
                                                                std::uint16_t port) {
  std::string key = absl::StrCat(address, " ", port);
  auto it = endpoints_.find(key);
  if (it != endpoints_.end()) return it->second.get();
  auto e = std::make_unique<exporter_endpoint>();
  e->core = this;
  e->key = key;
  absl::StatusOr<ucp_ep_h> ep =
      ucx_->connect(address, port, &remote_core::on_exporter_error, e.get());
  if (!ep.ok()) {
    // Whatever UCX says, the exporter cannot be reached.
    return absl::UnavailableError(absl::StrCat(
        "the exporter the descriptor names cannot be reached over this node's "
        "transports (",
        options_.transports.empty() ? std::string("UCX's choice") : options_.transports,
        "): ", ep.status().message()));
  }
  e->ep = *ep;
  // A flush completes once UCX has made the connection and wired the
  // endpoint up: then its lane report tells whether it reads with a lane of
  // its own, and a close may flush what was sent.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &remote_core::on_wired;
  param.user_data = this;
  ucs_status_ptr_t r = ucp_ep_flush_nbx(e->ep, &param);
  if (UCS_PTR_IS_PTR(r)) {
    e->wiring = r;
  } else {
    e->connected = UCS_PTR_STATUS(r) == UCS_OK;
  }
  exporter_endpoint* raw = e.get();
  endpoints_.emplace(std::move(key), std::move(e));
  return raw;
}

void remote_core::on_wired(void* request, ucs_status_t status, void* arg) {
  // Under the lock: inside progress, or a close.
  auto* core = static_cast<remote_core*>(arg);
  exporter_endpoint* wired = nullptr;
  for (auto& [key, e] : core->endpoints_) {
    if (e->wiring == request) wired = e.get();
  }
  for (auto& e : core->failed_endpoints_) {
    if (e->wiring == request) wired = e.get();
  }
  ucp_request_free(request);
  if (wired == nullptr) return;  // gone with the node
  if (status != UCS_OK && wired->failure.ok() && !core->stopping_) {
    // The connection was not made: its imports fail now, rather than go on
    // over it until UCX's error callback or their timeout.
    wired->wiring = nullptr;
    return core->endpoint_lost_locked(
        *wired,
        absl::UnavailableError(absl::StrCat(
            "the connection to the exporter could not be made; it went away or cannot be "
            "reached (UCX: ",
            ucs_status_string(status), ")")),
        /*from_ucx=*/true);
  }
  if (status == UCS_OK) wired->connected = true;
  core->wired_locked(*wired);
}

void remote_core::wired_locked(exporter_endpoint& e) {
  e.wiring = nullptr;
  std::vector<std::weak_ptr<remote_import>> waiting = std::move(e.awaiting_wireup);
  e.awaiting_wireup.clear();
  for (const std::weak_ptr<remote_import>& weak : waiting) {
    if (std::shared_ptr<remote_import> op = weak.lock()) op->on_wired_locked();
  }
}

void remote_core::on_exporter_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* e = static_cast<exporter_endpoint*>(arg);
  e->core->endpoint_lost_locked(
      *e,
      absl::UnavailableError(absl::StrCat(
          "the connection to the exporter broke; it went away or cannot be reached (UCX: ",
          ucs_status_string(status), ")")),
      /*from_ucx=*/true);
}

void remote_core::endpoint_lost_locked(exporter_endpoint& e, absl::Status why, bool from_ucx) {
  if (!e.failure.ok()) return;
  e.failure = std::move(why);
  std::vector<std::weak_ptr<remote_import>> users = std::move(e.users);
  e.users.clear();
  users.insert(users.end(), e.awaiting_wireup.begin(), e.awaiting_wireup.end());
  e.awaiting_wireup.clear();
  for (const std::weak_ptr<remote_import>& weak : users) {
    if (std::shared_ptr<remote_import> op = weak.lock()) op->on_endpoint_failed_locked(e.failure);
  }
  auto it = endpoints_.find(e.key);
  if (it != endpoints_.end() && it->second.get() == &e) {
    failed_endpoints_.push_back(std::move(it->second));
    endpoints_.erase(it);
  }
  if (!from_ucx) {
    close_endpoint_locked(e);
    return;
  }
  // Closed outside UCX's callback.
  asio::post(executor_, [weak = weak_from_this(), lost = &e] {
    std::shared_ptr<remote_core> core = weak.lock();
    if (core == nullptr) return;
    std::lock_guard lock(core->ucx_->mutex());
    if (core->stopping_) return;
    core->close_endpoint_locked(*lost);
  });
}

void remote_core::close_endpoint_locked(exporter_endpoint& e) {
  if (e.ep == nullptr) return;
  ucx_->close_endpoint(std::exchange(e.ep, nullptr));
  e.keys.clear();  // imports still reading hold theirs
}

void remote_core::track_locked(const std::shared_ptr<remote_import>& op) {
  imports_.emplace(op->request_id(), op);
}

void remote_core::untrack_locked(std::uint64_t request_id) {
  imports_.erase(request_id);
}

std::size_t remote_core::imports_in_flight() const {
  std::lock_guard lock(ucx_->mutex());
  return imports_.size();
}

remote_import_counts remote_core::imports_completed() const {
  std::lock_guard lock(ucx_->mutex());
  return completed_;
}

std::size_t remote_core::connections() const {
  std::lock_guard lock(ucx_->mutex());
  return importers_.size();
}

void remote_core::shutdown() {
  std::vector<std::shared_ptr<remote_import>> ops;
  {
    std::unique_lock lock(ucx_->mutex());
    if (stopping_) {
      // Another caller runs it: return once it is done, as it will, unless
      // this is a deleter or an end callback (on that caller's thread, or on
      // one that caller may wait for: it runs them all in drop()).
      if (retired_producers::in_drop()) return;
      shutdown_finished_.wait(lock, [this] { return shut_down_; });
      return;
    }
    stopping_ = true;
    // Imports in flight end with Cancelled now; what UCX still writes into
    // their buffers ends with the worker below, and the buffers after it.
    ops.reserve(imports_.size());
    for (auto& [id, op] : imports_) ops.push_back(op);
    for (auto& op : ops) op->on_shutdown_locked();
    // Receives under way finish first (bounded): UCX 1.13 may leave the
    // last message of a rendezvous queued on an endpoint closed under it,
    // and then aborts when the worker is destroyed.
    // Connections being made get up to 2 seconds of that to be made: UCX
    // 1.13 aborts in the worker's destruction after a forced close of one
    // still being made to a live exporter.
    const auto now = std::chrono::steady_clock::now();
    const auto until = now + std::chrono::seconds(5);
    const auto made_by = now + std::chrono::seconds(2);
    auto writing = [&ops] {
      return std::any_of(ops.begin(), ops.end(), [](const auto& op) { return op->writing(); });
    };
    auto connecting = [this, made_by] {
      return std::chrono::steady_clock::now() < made_by &&
             std::any_of(endpoints_.begin(), endpoints_.end(), [](const auto& e) {
               return e.second->ep != nullptr && !e.second->wired();
             });
    };
    while ((writing() || connecting()) && std::chrono::steady_clock::now() < until) {
      ucp_worker_progress(ucx_->worker());
    }
    // The exporters are alive: what was sent to them goes out first. A
    // connection never made (a listener that does not speak UCX) is closed
    // at once: a flush on it would never end, and UCX 1.13 aborts in the
    // worker's destruction with a request still queued on it.
    for (auto& [key, e] : endpoints_) {
      if (e->ep != nullptr) {
        ucx_->close_endpoint(std::exchange(e->ep, nullptr), e->connected && e->wired());
      }
    }
    for (auto& e : failed_endpoints_) close_endpoint_locked(*e);
    for (auto& [ep, c] : importers_) ucx_->close_endpoint(ep);
    importers_.clear();
    ucx_->settle_closes();
    while (!publications_.empty()) {
      retire_locked(publications_.begin(), publication_end::shutdown);
    }
    // Users' registrations too; their handles find nothing afterwards.
    registrations_.clear_locked();
    endpoints_.clear();
    failed_endpoints_.clear();
    // Peers see the connections go (an importer's hold request then fails
    // at once instead of waiting for an answer). Sends still reading a
    // publication's memory, and receives still writing an import's buffer,
    // end with the worker.
    ucx_->finalize();
    for (auto& op : ops) op->after_finalize_locked();
    imports_.clear();
    // What only gathers still read ends when they do.
    cancel_gathers_locked();
  }
  ops.clear();
  wait_for_gathers();
  {
    std::lock_guard lock(ucx_->mutex());
    for (auto& [lease, pub] : draining_) retire_holders_locked(pub);
    draining_.clear();
    to_delete_->add(retired_, ended_);
  }
  // Producers' deleters, without the lock: those of the publications ended
  // here, and those of publications that ended before that the executor has
  // not dropped yet.
  to_delete_->drop_all();
  // Told under the lock: a caller that wakes may destroy the node.
  std::lock_guard lock(ucx_->mutex());
  shut_down_ = true;
  shutdown_finished_.notify_all();
}

}  // namespace dlasync::detail
