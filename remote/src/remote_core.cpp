#include "remote/src/remote_core.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "asio/post.hpp"
#include "remote/src/remote_import.hpp"

namespace dlasync::detail {
namespace {

template <typename Message>
bool read_message(const void* header, std::size_t length, Message& m) {
  if (length != sizeof(Message)) return false;
  std::memcpy(&m, header, sizeof(m));
  return m.magic == remote_detail::protocol_magic;
}

// Whether UCX chose a lane of its own for RMA on `ep` ("rma_bw#" in its
// lane report): a native one, as cma over shared memory; without, UCX
// emulates RMA with active messages.
bool has_native_rma(ucp_ep_h ep) {
  char* text = nullptr;
  std::size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return false;
  ucp_ep_print_info(ep, f);
  std::fclose(f);
  const bool native = std::string_view(text, size).find("rma_bw#") != std::string_view::npos;
  std::free(text);  // NOLINT(cppcoreguidelines-no-malloc): open_memstream's buffer
  return native;
}

}  // namespace

using remote_detail::hold_release;
using remote_detail::hold_reply;
using remote_detail::hold_request;

remote_core::remote_core(runtime& rt, remote_node_options options, std::shared_ptr<ucx_worker> ucx)
    : rt_(rt), options_(std::move(options)), ucx_(std::move(ucx)), executor_(rt.get_executor()) {
  std::random_device random;
  lease_seed_ = (static_cast<std::uint64_t>(random()) << 32) ^ random();
}

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
        {remote_detail::am_fetch_request, &remote_core::on_am_fetch_request},
        {remote_detail::am_fetch_data, &remote_core::on_am_fetch_data},
    };
    for (const auto& [id, cb] : handlers) {
      if (absl::Status s = ucx_->set_am_handler(id, cb, this); !s.ok()) return s;
    }
  }
  ucx_->start();
  return absl::OkStatus();
}

ucs_status_t remote_core::on_am_request(void* arg, const void* header, std::size_t length, void*,
                                        std::size_t, const ucp_am_recv_param_t* param) {
  hold_request m;
  if (!read_message(header, length, m)) return UCS_OK;  // not ours: dropped
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return UCS_OK;
  static_cast<remote_core*>(arg)->on_hold_request_locked(m, param->reply_ep);
  return UCS_OK;
}

ucs_status_t remote_core::on_am_reply(void* arg, const void* header, std::size_t length, void*,
                                      std::size_t, const ucp_am_recv_param_t*) {
  hold_reply m;
  if (!read_message(header, length, m)) return UCS_OK;
  static_cast<remote_core*>(arg)->on_hold_reply_locked(m);
  return UCS_OK;
}

ucs_status_t remote_core::on_am_release(void* arg, const void* header, std::size_t length, void*,
                                        std::size_t, const ucp_am_recv_param_t*) {
  hold_release m;
  if (!read_message(header, length, m)) return UCS_OK;
  static_cast<remote_core*>(arg)->on_hold_release_locked(m);
  return UCS_OK;
}

ucs_status_t remote_core::on_am_fetch_request(void* arg, const void* header, std::size_t length,
                                              void*, std::size_t,
                                              const ucp_am_recv_param_t* param) {
  remote_detail::fetch_request m;
  if (!read_message(header, length, m)) return UCS_OK;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return UCS_OK;
  static_cast<remote_core*>(arg)->on_fetch_request_locked(m, param->reply_ep);
  return UCS_OK;
}

ucs_status_t remote_core::on_am_fetch_data(void* arg, const void* header, std::size_t length,
                                           void* data, std::size_t data_length,
                                           const ucp_am_recv_param_t* param) {
  remote_detail::fetch_data m;
  if (!read_message(header, length, m)) return UCS_OK;
  auto* self = static_cast<remote_core*>(arg);
  auto it = self->imports_.find(m.request_id);
  // Not ours, or late: UCX drops an unclaimed rendezvous when the handler
  // returns without receiving it.
  if (it == self->imports_.end()) return UCS_OK;
  std::shared_ptr<remote_import> op = it->second;
  op->on_fetch_data_locked(m, data, data_length, param);
  return UCS_OK;
}

void remote_core::on_hold_reply_locked(const hold_reply& m) {
  auto it = imports_.find(m.request_id);
  if (it == imports_.end()) return;  // late, or not ours
  std::shared_ptr<remote_import> op = it->second;
  op->on_hold_reply_locked(m);
}

void remote_core::send_locked(ucp_ep_h ep, unsigned id, const void* header, std::size_t length,
                              bool reply) {
  ucx_worker::am_message m;
  m.id = id;
  const auto* bytes = static_cast<const std::byte*>(header);
  m.bytes.assign(bytes, bytes + length);
  m.header_bytes = length;
  m.reply = reply;
  (void)ucx_->send_am(ep, std::move(m));
}

absl::StatusOr<exporter_endpoint*> remote_core::endpoint_locked(const std::string& address) {
  auto it = endpoints_.find(address);
  if (it != endpoints_.end()) return it->second.get();
  auto e = std::make_unique<exporter_endpoint>();
  e->core = this;
  e->address = address;
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(e->address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &remote_core::on_endpoint_error;
  p.err_handler.arg = e.get();
  ucs_status_t s = ucp_ep_create(ucx_->worker(), &p, &e->ep);
  if (s == UCS_ERR_UNREACHABLE) {
    // Some transports cannot report a lost peer (UCX 1.13's shared memory:
    // posix and sysv have no peer failure handler). Then the endpoint goes
    // without, and import_timeout is what bounds an import from a lost
    // exporter.
    p.field_mask &= ~(UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER);
    s = ucp_ep_create(ucx_->worker(), &p, &e->ep);
    e->detects_failure = false;
  }
  if (s != UCS_OK) {
    // Whatever UCX says (unreachable, a shared-memory segment that is gone),
    // the exporter cannot be reached.
    return absl::UnavailableError(absl::StrCat(
        "the exporter named by the descriptor cannot be reached over this node's transports (",
        options_.transports.empty() ? std::string("UCX's choice") : options_.transports,
        "); it went away, or it runs other transports (UCX: ", ucs_status_string(s), ")"));
  }
  e->native_rma = has_native_rma(e->ep);
  exporter_endpoint* raw = e.get();
  endpoints_.emplace(address, std::move(e));
  return raw;
}

void remote_core::on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* e = static_cast<exporter_endpoint*>(arg);
  remote_core* self = e->core;
  if (!e->failure.ok()) return;
  e->failure = absl::UnavailableError(
      absl::StrCat("the connection to the exporter broke; it went away or cannot be reached (UCX: ",
                   ucs_status_string(status), ")"));
  for (const std::weak_ptr<remote_import>& weak : e->users) {
    if (std::shared_ptr<remote_import> op = weak.lock()) op->on_endpoint_failed_locked(e->failure);
  }
  e->users.clear();
  auto it = self->endpoints_.find(e->address);
  if (it != self->endpoints_.end() && it->second.get() == e) {
    self->failed_endpoints_.push_back(std::move(it->second));
    self->endpoints_.erase(it);
  }
  // Closed outside UCX's callback.
  asio::post(self->executor_, [weak = self->weak_from_this(), e] {
    std::shared_ptr<remote_core> core = weak.lock();
    if (core == nullptr) return;
    std::lock_guard lock(core->ucx_->mutex());
    if (core->stopping_) return;
    core->close_endpoint_locked(*e);
  });
}

void remote_core::close_endpoint_locked(exporter_endpoint& e) {
  if (e.ep == nullptr) return;
  ucx_->close_endpoint(std::exchange(e.ep, nullptr));
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

void remote_core::shutdown() {
  std::vector<published_holder> dropped;
  {
    std::lock_guard lock(ucx_->mutex());
    if (stopping_) return;
    stopping_ = true;
    // Imports in flight end with Cancelled; their requests complete with
    // errors when the endpoints close below.
    std::vector<std::shared_ptr<remote_import>> ops;
    ops.reserve(imports_.size());
    for (auto& [id, op] : imports_) ops.push_back(op);
    for (auto& op : ops) {
      op->on_endpoint_failed_locked(absl::CancelledError("the remote node shut down"));
    }
    for (auto& [address, e] : endpoints_) {
      for (const std::weak_ptr<remote_import>& weak : e->users) {
        if (std::shared_ptr<remote_import> op = weak.lock()) {
          op->on_endpoint_failed_locked(absl::CancelledError("the remote node shut down"));
        }
      }
      close_endpoint_locked(*e);
    }
    for (auto& e : failed_endpoints_) close_endpoint_locked(*e);
    ucx_->settle_closes();
    imports_.clear();
    while (!publications_.empty()) retire_locked(publications_.begin());
    endpoints_.clear();
    failed_endpoints_.clear();
    // Peers see the connections go (an importer's hold request then fails
    // at once instead of waiting for an answer). Sends still reading a
    // publication's memory end with the worker.
    ucx_->finalize();
    for (auto& [lease, pub] : draining_) retired_.push_back(std::move(pub.holder));
    draining_.clear();
    dropped = std::move(retired_);
  }
  dropped.clear();  // producers' deleters, without the lock
}

}  // namespace dlasync::detail
