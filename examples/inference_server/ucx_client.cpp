#include "ucx_client.hpp"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/strings/str_cat.h"
#include "remote/src/ucx_worker.hpp"
#include "ucx_front.hpp"

namespace dlasync::examples {
namespace {

// Bytes of a request that travel as the message's header; the rest is its
// data (eager when small, rendezvous when large).
constexpr std::size_t header_part = 1024;

struct link {
  ucp_ep_h ep = nullptr;
  bool broken = false;
  std::deque<std::vector<std::byte>> answers;
};

}  // namespace

struct ucx_client::state {
  std::shared_ptr<ucx_worker> ucx;
  std::condition_variable answered;  // with ucx->mutex()
  std::vector<std::unique_ptr<link>> links;
  bool stopped = false;

  link* find_locked(ucp_ep_h ep) {
    for (auto& l : links) {
      if (l->ep == ep) return l.get();
    }
    return nullptr;
  }

  static ucs_status_t on_response(void* arg, const void* header, std::size_t header_length, void*,
                                  std::size_t, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<state*>(arg);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return UCS_OK;
    link* l = self->find_locked(param->reply_ep);
    if (l == nullptr) return UCS_OK;
    const auto* b = static_cast<const std::byte*>(header);
    l->answers.emplace_back(b, b + header_length);
    self->answered.notify_all();
    return UCS_OK;
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

absl::StatusOr<response> ucx_client::call(int c, std::span<const std::byte> frame,
                                          std::chrono::milliseconds timeout) {
  {
    std::lock_guard lock(state_->ucx->mutex());
    state_->links.at(static_cast<std::size_t>(c))->answers.clear();
  }
  if (absl::Status sent = send(c, frame); !sent.ok()) return sent;
  return receive(c, timeout);
}

namespace {

// The request frame as an active message: its first bytes as the header,
// the rest as the data. The worker keeps the copy while UCX reads it,
// which may be after the caller stopped waiting.
ucx_worker::am_message request_message(std::span<const std::byte> frame, bool rendezvous) {
  ucx_worker::am_message m;
  m.id = ucx_request_am;
  m.bytes.assign(frame.begin(), frame.end());
  m.header_bytes = std::min(frame.size(), header_part);
  m.reply = true;
  if (rendezvous) m.carried_by = ucx_worker::am_message::protocol::rendezvous;
  return m;
}

}  // namespace

absl::Status ucx_client::send(int c, std::span<const std::byte> frame, bool rendezvous) {
  std::lock_guard lock(state_->ucx->mutex());
  link& l = *state_->links.at(static_cast<std::size_t>(c));
  if (l.broken || state_->stopped) return absl::UnavailableError("the UCX connection broke");
  const ucs_status_t st = state_->ucx->send_am(l.ep, request_message(frame, rendezvous));
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

absl::Status ucx_client::stall(std::span<const int> connections, std::span<const std::byte> frame,
                               const std::function<void()>& while_stalled) {
  // Progress happens only under the worker's mutex: holding it stops the
  // worker, and sending without progress leaves each rendezvous announced
  // and never served.
  std::lock_guard lock(state_->ucx->mutex());
  for (int c : connections) {
    link& l = *state_->links.at(static_cast<std::size_t>(c));
    if (l.broken || state_->stopped) return absl::UnavailableError("the UCX connection broke");
    if (ucs_status_t st = state_->ucx->send_am(l.ep, request_message(frame, true));
        UCS_STATUS_IS_ERR(st)) {
      return absl::UnavailableError(absl::StrCat("UCX send failed: ", ucs_status_string(st)));
    }
  }
  while_stalled();
  state_->ucx->progress();
  return absl::OkStatus();
}

absl::StatusOr<response> ucx_client::receive(int c, std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->ucx->mutex());
  link& l = *state_->links.at(static_cast<std::size_t>(c));
  const bool done = state_->answered.wait_for(
      lock, timeout, [&] { return !l.answers.empty() || l.broken || state_->stopped; });
  if (l.answers.empty()) {
    return done ? absl::UnavailableError("the UCX connection broke before the response")
                : absl::DeadlineExceededError("no response over UCX in time");
  }
  const std::vector<std::byte> bytes = std::move(l.answers.front());
  l.answers.pop_front();
  if (bytes.size() < frame_header_bytes) return absl::InvalidArgumentError("short response");
  absl::StatusOr<std::uint32_t> length = read_frame_header(
      std::span<const std::byte, frame_header_bytes>(bytes.data(), frame_header_bytes),
      response_magic, 1 << 20);
  if (!length.ok()) return length.status();
  if (*length != bytes.size() - frame_header_bytes) {
    return absl::InvalidArgumentError("a response whose length disagrees with its frame");
  }
  return parse_response(std::span(bytes).subspan(frame_header_bytes));
}

void ucx_client::stop() {
  std::lock_guard lock(state_->ucx->mutex());
  if (state_->stopped) return;
  state_->stopped = true;
  for (auto& l : state_->links) state_->ucx->close_endpoint(l->ep);
  state_->answered.notify_all();
  state_->ucx->finalize();
}

}  // namespace dlasync::examples
