#include "ucx_front.hpp"

#include <netinet/in.h>
#include <sys/socket.h>

#include <arpa/inet.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/strings/str_cat.h"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/post.hpp"
#include "dlasync/remote/ucx_worker.hpp"

namespace dlasync::examples {
namespace {

struct connection {
  ucp_ep_h ep = nullptr;
  bool alive = true;
};

// A request whose body waits for the budget: what the message carried in
// its header, and its data (copied when it came eagerly, UCX's descriptor
// when it comes by rendezvous).
struct pending {
  std::shared_ptr<connection> conn;
  std::uint32_t length = 0;
  std::vector<std::byte> head;  // the body's first bytes, from the header
  std::vector<std::byte> eager;
  void* rendezvous = nullptr;
};

}  // namespace

struct ucx_front::state : std::enable_shared_from_this<ucx_front::state> {
  asio::any_io_executor executor;
  options opts;
  std::shared_ptr<memory_budget> budget;
  handler_fn handle;
  counter_fn count;
  std::shared_ptr<ucx_worker> ucx;
  ucp_listener_h listener = nullptr;
  unsigned short port = 0;
  bool stopped = false;
  std::unordered_map<ucp_ep_h, std::shared_ptr<connection>> connections;
  std::atomic<std::uint64_t> accepted{0};
  std::atomic<std::uint64_t> received{0};
  // Handlers running; stop() waits for them.
  std::mutex running_mutex;
  std::condition_variable running_done;
  int running = 0;

  static void on_connection(ucp_conn_request_h request, void* arg);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_request(void* arg, const void* header, std::size_t header_length,
                                 void* data, std::size_t length, const ucp_am_recv_param_t* param);

  // Sends `r` to the connection, when it is still there. Requires the lock.
  void reply_locked(connection& c, const response& r) {
    count(r.code);
    if (stopped || !c.alive) return;
    ucx_worker::am_message m;
    m.id = ucx_response_am;
    m.bytes = encode_response(r);
    m.header_bytes = m.bytes.size();
    // REPLY: the client learns which of its connections the answer is for.
    m.reply = true;
    (void)ucx->send_am(c.ep, std::move(m));
    ucx->progress();
  }

  void granted(const std::shared_ptr<pending>& p, const absl::Status& status);
  void run_handler(const std::shared_ptr<pending>& p, std::shared_ptr<std::byte[]> body);
};

void ucx_front::state::on_connection(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<state*>(arg);
  if (self->stopped) {
    ucp_listener_reject(self->listener, request);
    return;
  }
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.conn_request = request;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &state::on_endpoint_error;
  p.err_handler.arg = self;
  ucp_ep_h ep = nullptr;
  if (ucp_ep_create(self->ucx->worker(), &p, &ep) != UCS_OK) return;
  auto c = std::make_shared<connection>();
  c->ep = ep;
  self->connections.emplace(ep, std::move(c));
  self->accepted.fetch_add(1);
}

void ucx_front::state::on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t) {
  auto* self = static_cast<state*>(arg);
  auto it = self->connections.find(ep);
  if (it == self->connections.end()) return;
  it->second->alive = false;
  self->connections.erase(it);
  // Closed outside UCX's callback.
  asio::post(self->executor, [weak = self->weak_from_this(), ep] {
    std::shared_ptr<state> s = weak.lock();
    if (s == nullptr) return;
    std::lock_guard lock(s->ucx->mutex());
    if (!s->stopped) s->ucx->close_endpoint(ep);
  });
}

ucs_status_t ucx_front::state::on_request(void* arg, const void* header, std::size_t header_length,
                                          void* data, std::size_t length,
                                          const ucp_am_recv_param_t* param) {
  auto* self = static_cast<state*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return UCS_OK;  // no way back
  if (self->stopped) return UCS_OK;
  auto it = self->connections.find(param->reply_ep);
  if (it == self->connections.end()) return UCS_OK;  // not a connection of ours
  connection& c = *it->second;
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  // Refusals drop the data: a rendezvous payload is never transferred.
  auto refuse = [&](std::uint64_t id, absl::StatusCode code, std::string text) {
    self->reply_locked(c, response{id, code, 0, 0, std::move(text)});
    return UCS_OK;
  };
  if (header_length < frame_header_bytes) {
    return refuse(0, absl::StatusCode::kInvalidArgument,
                  absl::StrCat("a UCX request's header holds ", header_length,
                               " bytes; it must start with the 8-byte frame header"));
  }
  const auto* bytes = static_cast<const std::byte*>(header);
  const std::span<const std::byte, frame_header_bytes> frame_header(bytes, frame_header_bytes);
  absl::StatusOr<std::uint32_t> body_length =
      read_frame_header(frame_header, request_magic, self->opts.max_body);
  const std::span<const std::byte> head(bytes + frame_header_bytes,
                                        header_length - frame_header_bytes);
  const std::uint64_t id = peek_request_id(head);
  if (!body_length.ok()) {
    return refuse(id, body_length.status().code(), std::string(body_length.status().message()));
  }
  const std::uint64_t carried = head.size() + length;
  if (*body_length != carried) {
    return refuse(
        id, absl::StatusCode::kInvalidArgument,
        absl::StrCat("the frame's body length says ", *body_length, " bytes; the message carries ",
                     carried, ": send the whole frame, header and payload"));
  }
  const std::uint32_t total = *body_length;
  if (total <= self->budget->limit() && total > self->opts.connection_budget) {
    return refuse(id, absl::StatusCode::kResourceExhausted,
                  absl::StrCat("request of ", total, " bytes exceeds the per-connection budget of ",
                               self->opts.connection_budget,
                               " bytes (--connection_budget_mib): send smaller tensors"));
  }
  auto p = std::make_shared<pending>();
  p->conn = it->second;
  p->length = total;
  p->head.assign(head.begin(), head.end());
  if (rendezvous) {
    p->rendezvous = data;
  } else {
    const auto* d = static_cast<const std::byte*>(data);
    if (length > 0) p->eager.assign(d, d + length);
  }
  // The grant (or the refusal of a body larger than the whole budget)
  // continues on the executor, never inside UCX's callback.
  self->budget->acquire(total, [weak = self->weak_from_this(), p](absl::Status s) {
    std::shared_ptr<state> st = weak.lock();
    if (st == nullptr) return;
    asio::post(st->executor, [st, p, s = std::move(s)] { st->granted(p, s); });
  });
  return rendezvous ? UCS_INPROGRESS : UCS_OK;
}

void ucx_front::state::granted(const std::shared_ptr<pending>& p, const absl::Status& status) {
  std::lock_guard lock(ucx->mutex());
  if (stopped) {  // the worker is gone, and the descriptor with it
    if (status.ok()) budget->release(p->length);
    return;
  }
  if (!status.ok()) {
    if (p->rendezvous != nullptr) ucp_am_data_release(ucx->worker(), p->rendezvous);
    reply_locked(*p->conn,
                 response{peek_request_id(p->head), status.code(), 0, 0,
                          absl::StrCat("request of ", p->length, " bytes: ", status.message())});
    return;
  }
  // The body gives its bytes back to the budget when its last user lets go.
  std::shared_ptr<std::byte[]> body(new std::byte[p->length],
                                    [b = budget, n = p->length](std::byte* q) {
                                      delete[] q;
                                      b->release(n);
                                    });
  // (memcpy takes no null pointer, which empty vectors may give.)
  if (!p->head.empty()) std::memcpy(body.get(), p->head.data(), p->head.size());
  if (p->rendezvous == nullptr) {
    if (!p->eager.empty()) {
      std::memcpy(body.get() + p->head.size(), p->eager.data(), p->eager.size());
    }
    return run_handler(p, std::move(body));
  }
  struct receiving {
    std::shared_ptr<state> self;
    std::shared_ptr<pending> p;
    std::shared_ptr<std::byte[]> body;
  };
  auto* r = new receiving{shared_from_this(), p, body};
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.recv_am = [](void* request, ucs_status_t s, std::size_t, void* user_data) {
    std::unique_ptr<receiving> done(static_cast<receiving*>(user_data));
    ucp_request_free(request);
    if (s == UCS_OK) done->self->run_handler(done->p, std::move(done->body));
  };
  rp.user_data = r;
  ucs_status_ptr_t s = ucp_am_recv_data_nbx(
      ucx->worker(), p->rendezvous, body.get() + p->head.size(), p->length - p->head.size(), &rp);
  if (s == nullptr) {
    std::unique_ptr<receiving> done(r);
    run_handler(p, std::move(done->body));
  } else if (UCS_PTR_IS_ERR(s)) {
    delete r;  // the client went away
  }
  ucx->progress();
}

void ucx_front::state::run_handler(const std::shared_ptr<pending>& p,
                                   std::shared_ptr<std::byte[]> body) {
  received.fetch_add(frame_header_bytes + p->length);
  {
    std::lock_guard lock(running_mutex);
    ++running;
  }
  // Posted: co_spawn would start the handler right here, under the lock.
  asio::post(executor, [self = shared_from_this(), p, body = std::move(body)]() mutable {
    asio::co_spawn(
        self->executor,
        [self, p, body = std::move(body)]() mutable -> asio::awaitable<void> {
          const std::uint32_t length = p->length;
          const response r = co_await self->handle(std::move(body), length);
          {
            std::lock_guard lock(self->ucx->mutex());
            self->reply_locked(*p->conn, r);
          }
          std::lock_guard lock(self->running_mutex);
          if (--self->running == 0) self->running_done.notify_all();
        },
        asio::detached);
  });
}

absl::StatusOr<std::unique_ptr<ucx_front>> ucx_front::create(asio::any_io_executor executor,
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
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(s->opts.port));
    if (inet_pton(AF_INET, s->opts.address.c_str(), &addr.sin_addr) != 1) {
      s->ucx->finalize();
      return absl::InvalidArgumentError(
          absl::StrCat("--address=", s->opts.address, " is not an IPv4 address"));
    }
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    lp.sockaddr.addrlen = sizeof(addr);
    lp.conn_handler.cb = &state::on_connection;
    lp.conn_handler.arg = s.get();
    if (ucs_status_t st = ucp_listener_create(s->ucx->worker(), &lp, &s->listener); st != UCS_OK) {
      s->ucx->finalize();
      return absl::UnavailableError(absl::StrCat("UCX cannot listen on ", s->opts.address, ":",
                                                 s->opts.port, ": ", ucs_status_string(st)));
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(s->listener, &attr) == UCS_OK) {
      s->port = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
    }
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
std::uint64_t ucx_front::connections() const {
  return state_->accepted.load();
}
std::uint64_t ucx_front::bytes_received() const {
  return state_->received.load();
}

void ucx_front::stop() {
  {
    // Handlers under way finish first (their answers still go out).
    std::unique_lock lock(state_->running_mutex);
    state_->running_done.wait(lock, [&] { return state_->running == 0; });
  }
  std::lock_guard lock(state_->ucx->mutex());
  if (state_->stopped) return;
  state_->stopped = true;
  if (state_->listener != nullptr) ucp_listener_destroy(state_->listener);
  for (auto& [ep, c] : state_->connections) {
    c->alive = false;
    state_->ucx->close_endpoint(ep);
  }
  state_->connections.clear();
  state_->ucx->finalize();
}

}  // namespace dlasync::examples
