#include "ucx_front.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "asio/post.hpp"
#include "ucx_front_state.hpp"

namespace dlasync::examples {
namespace {

// The numeric address a connection request came from; empty where UCX
// does not say.
std::string client_address(ucp_conn_request_h request) {
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(request, &attr) != UCS_OK) return {};
  char text[INET6_ADDRSTRLEN] = {};
  const auto* any = reinterpret_cast<const sockaddr*>(&attr.client_address);
  const void* where = nullptr;
  if (any->sa_family == AF_INET) {
    where = &reinterpret_cast<const sockaddr_in*>(any)->sin_addr;
  } else if (any->sa_family == AF_INET6) {
    where = &reinterpret_cast<const sockaddr_in6*>(any)->sin6_addr;
  }
  if (where == nullptr || inet_ntop(any->sa_family, where, text, sizeof text) == nullptr) return {};
  return text;
}

}  // namespace

void ucx_front::state::on_connection(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<state*>(arg);
  if (self->stopping) {
    self->ucx->reject(request);
    return;
  }
  std::optional<connection_limit::slot> slot;
  if (self->opts.connections != nullptr) {
    slot = self->opts.connections->try_take();
    if (!slot) {
      self->refused_connections.fetch_add(1);
      self->ucx->reject(request);
      return;
    }
  }
  std::string peer = client_address(request);
  absl::StatusOr<ucp_ep_h> accepted = self->ucx->accept(request, &state::on_endpoint_error, self);
  if (!accepted.ok()) return;
  const ucp_ep_h ep = *accepted;
  auto c = std::make_shared<connection>();
  c->ep = ep;
  c->slot = std::move(slot);
  c->peer = std::move(peer);
  self->connections.emplace(ep, std::move(c));
  self->accepted.fetch_add(1);
}

void ucx_front::state::on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t) {
  auto* self = static_cast<state*>(arg);
  auto it = self->connections.find(ep);
  if (it == self->connections.end()) return;
  self->close_connection(it->second, /*from_ucx=*/true);
}

void ucx_front::state::close_connection(const std::shared_ptr<connection>& c, bool from_ucx) {
  if (!c->alive) return;
  c->alive = false;
  c->slot.reset();
  // Its requests waiting for room leave the line (granted() drops them).
  for (const auto& [key, r] : requests) {
    if (r->conn == c && r->queued) budget->cancel(r->ticket, absl::CancelledError("closed"));
  }
  const ucp_ep_h ep = c->ep;
  // Last use of `c`: it may be the map's own pointer, which this destroys.
  connections.erase(ep);
  if (!from_ucx) {
    ucx->close_endpoint(ep);
    return;
  }
  asio::post(executor, [weak = weak_from_this(), ep] {
    std::shared_ptr<state> s = weak.lock();
    if (s == nullptr) return;
    std::lock_guard lock(s->ucx->mutex());
    if (!s->stopped) s->ucx->close_endpoint(ep);
  });
}

absl::StatusOr<std::unique_ptr<ucx_front>> ucx_front::create(const asio::any_io_executor& executor,
                                                             options o,
                                                             std::shared_ptr<memory_budget> budget,
                                                             handler_fn handle, counter_fn count) {
  auto s = std::make_shared<state>();
  s->executor = executor;
  s->opts = std::move(o);
  s->budget = std::move(budget);
  s->handle = std::move(handle);
  s->count = std::move(count);
  absl::StatusOr<std::shared_ptr<ucx_worker>> w = ucx_worker::create(executor, s->opts.transports);
  if (!w.ok()) return w.status();
  s->ucx = *std::move(w);
  {
    std::lock_guard lock(s->ucx->mutex());
    if (absl::Status st = s->ucx->set_am_handler(ucx_request_am, &state::on_request, s.get());
        !st.ok()) {
      s->ucx->finalize();
      return st;
    }
    absl::StatusOr<std::uint16_t> port = s->ucx->listen(
        s->opts.address, static_cast<std::uint16_t>(s->opts.port), &state::on_connection, s.get());
    if (!port.ok()) {
      s->ucx->finalize();
      return absl::Status(port.status().code(),
                          absl::StrCat("--address=", s->opts.address, " --ucx_port=", s->opts.port,
                                       ": ", port.status().message()));
    }
    s->port = *port;
  }
  s->ucx->start();
  return std::unique_ptr<ucx_front>(new ucx_front(std::move(s)));
}

ucx_front::~ucx_front() {
  stop();
}

unsigned short ucx_front::port() const {
  return state_->port;
}

ucx_front::counters ucx_front::stats() const {
  counters c;
  c.connections = state_->accepted.load();
  c.refused_connections = state_->refused_connections.load();
  c.bytes_received = state_->bytes_in.load();
  c.refused_queue = state_->refused_queue.load();
  c.closed_late = state_->closed_late.load();
  return c;
}

ucx_front::in_progress ucx_front::requests_in_progress() const {
  in_progress n;
  {
    std::lock_guard lock(state_->ucx->mutex());
    for (const auto& [key, r] : state_->requests) {
      if (r->queued) {
        ++n.waiting;
      } else if (r->receiving) {
        ++n.receiving;
      } else {
        ++n.handling;  // granted, on its way to its handler or its answer
      }
    }
  }
  std::lock_guard lock(state_->running_mutex);
  n.handling += static_cast<std::size_t>(state_->running);
  return n;
}

void ucx_front::stop() {
  state& s = *state_;
  {
    std::lock_guard lock(s.ucx->mutex());
    if (s.stopping) return;
    s.stopping = true;  // no new connection, request or handler from here on
  }
  {
    // Handlers under way finish first (their answers still go out).
    std::unique_lock lock(s.running_mutex);
    s.running_done.wait(lock, [&] { return s.running == 0; });
  }
  std::lock_guard lock(s.ucx->mutex());
  s.ucx->stop_listening();
  std::vector<std::shared_ptr<connection>> open;
  for (auto& [ep, c] : s.connections) open.push_back(c);
  for (const std::shared_ptr<connection>& c : open) s.close_connection(c, /*from_ucx=*/false);
  // Descriptors of rendezvous bodies never received go back to UCX while it
  // is there; receives under way end as the endpoints close, or with the
  // worker.
  for (const auto& [key, r] : s.requests) s.release_rendezvous(*r);
  s.ucx->finalize();
  s.stopped = true;
  // Receives that UCX did not complete as the worker went: nothing writes
  // their bodies any more, which go back to the budget now.
  std::vector<std::shared_ptr<ucx_request>> left;
  for (const auto& [key, r] : s.requests) left.push_back(r);
  for (const std::shared_ptr<ucx_request>& r : left) {
    if (r->receiving) s.received(r.get(), UCS_ERR_CANCELED);
  }
}

}  // namespace dlasync::examples
