#include "ucx_client.hpp"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/strings/str_cat.h"
#include "remote/src/ucx_worker.hpp"
#include "ucx_protocol.hpp"

namespace dlasync::examples {
namespace {

struct link {
  ucp_ep_h ep = nullptr;
  bool broken = false;
  std::deque<absl::StatusOr<ucx_answer>> answers;
};

}  // namespace

struct ucx_client::state {
  std::shared_ptr<ucx_worker> ucx;
  std::condition_variable answered;  // with ucx->mutex()
  std::vector<std::unique_ptr<link>> links;
  bool stopped = false;

  // An answer whose data comes by rendezvous, until it has arrived.
  struct arriving {
    state* owner = nullptr;
    link* to = nullptr;
    ucx_answer answer;
  };
  std::unordered_map<arriving*, std::unique_ptr<arriving>> receiving;

  link* find_locked(ucp_ep_h ep) {
    for (auto& l : links) {
      if (l->ep == ep) return l.get();
    }
    return nullptr;
  }

  void answer_locked(link& l, absl::StatusOr<ucx_answer> a) {
    l.answers.push_back(std::move(a));
    answered.notify_all();
  }

  static ucs_status_t on_response(void* arg, const void* header, std::size_t header_length,
                                  void* data, std::size_t length,
                                  const ucp_am_recv_param_t* param) {
    auto* self = static_cast<state*>(arg);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return UCS_OK;
    link* l = self->find_locked(param->reply_ep);
    if (l == nullptr) return UCS_OK;
    const std::optional<ucx_header> h =
        ucx_header::decode(std::span(static_cast<const std::byte*>(header), header_length));
    if (!h || h->magic != ucx_response_magic ||
        h->word > static_cast<std::uint32_t>(absl::StatusCode::kUnauthenticated)) {
      self->answer_locked(*l, absl::InvalidArgumentError(absl::StrCat(
                                  "an answer whose header (", header_length,
                                  " bytes) is not a response's: magic \"KV2R\", a status code")));
      return UCS_OK;
    }
    ucx_answer a{h->tag, static_cast<absl::StatusCode>(h->word), std::string(length, '\0')};
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
      if (length > 0) std::memcpy(a.bytes.data(), data, length);
      self->answer_locked(*l, std::move(a));
      return UCS_OK;
    }
    auto pending = std::make_unique<arriving>(arriving{self, l, std::move(a)});
    arriving* p = pending.get();
    self->receiving.emplace(p, std::move(pending));
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = [](void* request, ucs_status_t status, std::size_t, void* user_data) {
      ucp_request_free(request);
      auto* done = static_cast<arriving*>(user_data);
      done->owner->arrived(done, status);
    };
    rp.user_data = p;
    ucs_status_ptr_t r =
        ucp_am_recv_data_nbx(self->ucx->worker(), data, p->answer.bytes.data(), length, &rp);
    if (!UCS_PTR_IS_PTR(r)) self->arrived(p, UCS_PTR_STATUS(r));
    return UCS_OK;
  }

  void arrived(arriving* p, ucs_status_t status) {
    auto it = receiving.find(p);
    if (it == receiving.end()) return;
    std::unique_ptr<arriving> done = std::move(it->second);
    receiving.erase(it);
    if (status == UCS_OK) {
      answer_locked(*done->to, std::move(done->answer));
    } else {
      answer_locked(*done->to,
                    absl::UnavailableError(absl::StrCat("an answer's data did not arrive: ",
                                                        ucs_status_string(status))));
    }
  }

  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t) {
    auto* self = static_cast<state*>(arg);
    if (link* l = self->find_locked(ep)) l->broken = true;
    self->answered.notify_all();
  }
};

absl::StatusOr<std::unique_ptr<ucx_client>> ucx_client::create(
    const asio::any_io_executor& executor, const std::string& transports) {
  auto s = std::make_shared<state>();
  absl::StatusOr<std::shared_ptr<ucx_worker>> w = ucx_worker::create(executor, transports);
  if (!w.ok()) return w.status();
  s->ucx = *std::move(w);
  {
    std::lock_guard lock(s->ucx->mutex());
    if (absl::Status st = s->ucx->set_am_handler(ucx_response_am, &state::on_response, s.get());
        !st.ok()) {
      s->ucx->finalize();
      return st;
    }
  }
  s->ucx->start();
  return std::unique_ptr<ucx_client>(new ucx_client(std::move(s)));
}

ucx_client::~ucx_client() {
  stop();
}

absl::StatusOr<int> ucx_client::connect(const std::string& host, int port) {
  std::lock_guard lock(state_->ucx->mutex());
  auto l = std::make_unique<link>();
  absl::StatusOr<ucp_ep_h> ep =
      state_->ucx->connect(host, static_cast<std::uint16_t>(port), &state::on_error, state_.get());
  if (!ep.ok()) {
    return absl::Status(ep.status().code(), absl::StrCat("--host=", host, " --ucx_port=", port,
                                                         ": ", ep.status().message()));
  }
  l->ep = *ep;
  state_->links.push_back(std::move(l));
  state_->ucx->progress();
  return static_cast<int>(state_->links.size() - 1);
}

absl::StatusOr<ucx_answer> ucx_client::call(int c, std::uint64_t tag,
                                            std::span<const std::byte> message,
                                            std::chrono::milliseconds timeout) {
  {
    std::lock_guard lock(state_->ucx->mutex());
    state_->links.at(static_cast<std::size_t>(c))->answers.clear();
  }
  if (absl::Status sent = send(c, tag, message); !sent.ok()) return sent;
  return receive(c, timeout);
}

namespace {

// A request as an active message: the header, then the message as its
// data. The worker keeps the copy while UCX reads it, which may be after
// the caller stopped waiting.
ucx_worker::am_message request_message(std::uint64_t tag, std::span<const std::byte> message,
                                       bool rendezvous) {
  ucx_worker::am_message m;
  m.id = ucx_request_am;
  m.bytes = ucx_request_bytes(tag, message);
  m.header_bytes = ucx_header_bytes;
  m.reply = true;
  if (rendezvous) m.carried_by = ucx_worker::am_message::protocol::rendezvous;
  return m;
}

}  // namespace

absl::Status ucx_client::send(int c, std::uint64_t tag, std::span<const std::byte> message,
                              bool rendezvous) {
  std::lock_guard lock(state_->ucx->mutex());
  link& l = *state_->links.at(static_cast<std::size_t>(c));
  if (l.broken || state_->stopped) return absl::UnavailableError("the UCX connection broke");
  const ucs_status_t st = state_->ucx->send_am(l.ep, request_message(tag, message, rendezvous));
  if (UCS_STATUS_IS_ERR(st)) {
    return absl::UnavailableError(absl::StrCat("UCX send failed: ", ucs_status_string(st)));
  }
  state_->ucx->progress();
  return absl::OkStatus();
}

absl::Status ucx_client::send_raw(int c, unsigned id, bool reply, std::span<const std::byte> header,
                                  std::size_t data_bytes, std::byte fill) {
  std::lock_guard lock(state_->ucx->mutex());
  link& l = *state_->links.at(static_cast<std::size_t>(c));
  if (l.broken || state_->stopped) return absl::UnavailableError("the UCX connection broke");
  ucx_worker::am_message m;
  m.id = id;
  m.bytes.assign(header.begin(), header.end());
  m.header_bytes = header.size();
  m.bytes.resize(header.size() + data_bytes, fill);
  m.reply = reply;
  if (ucs_status_t st = state_->ucx->send_am(l.ep, std::move(m)); UCS_STATUS_IS_ERR(st)) {
    return absl::UnavailableError(absl::StrCat("UCX send failed: ", ucs_status_string(st)));
  }
  state_->ucx->progress();
  return absl::OkStatus();
}

absl::Status ucx_client::stall(std::span<const int> connections, std::uint64_t tag,
                               std::span<const std::byte> message,
                               const std::function<void()>& while_stalled) {
  // Progress happens only under the worker's mutex: holding it stops the
  // worker, and sending without progress leaves each rendezvous announced
  // and never served.
  std::lock_guard lock(state_->ucx->mutex());
  for (int c : connections) {
    link& l = *state_->links.at(static_cast<std::size_t>(c));
    if (l.broken || state_->stopped) return absl::UnavailableError("the UCX connection broke");
    if (ucs_status_t st = state_->ucx->send_am(l.ep, request_message(tag, message, true));
        UCS_STATUS_IS_ERR(st)) {
      return absl::UnavailableError(absl::StrCat("UCX send failed: ", ucs_status_string(st)));
    }
  }
  while_stalled();
  state_->ucx->progress();
  return absl::OkStatus();
}

absl::StatusOr<ucx_answer> ucx_client::receive(int c, std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->ucx->mutex());
  link& l = *state_->links.at(static_cast<std::size_t>(c));
  const bool done = state_->answered.wait_for(
      lock, timeout, [&] { return !l.answers.empty() || l.broken || state_->stopped; });
  if (l.answers.empty()) {
    return done ? absl::UnavailableError("the UCX connection broke before the response")
                : absl::DeadlineExceededError("no response over UCX in time");
  }
  absl::StatusOr<ucx_answer> a = std::move(l.answers.front());
  l.answers.pop_front();
  return a;
}

void ucx_client::stop() {
  std::lock_guard lock(state_->ucx->mutex());
  if (state_->stopped) return;
  state_->stopped = true;
  for (auto& l : state_->links) state_->ucx->close_endpoint(l->ep);
  state_->answered.notify_all();
  state_->ucx->finalize();
  state_->receiving.clear();  // answers that were still arriving
}

}  // namespace dlasync::examples
