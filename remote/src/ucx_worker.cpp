#include "remote/src/ucx_worker.hpp"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "asio/post.hpp"
#include "remote/src/ucx_error.hpp"

namespace dlasync::remote_detail {

absl::Status ucx_error(ucs_status_t status, const std::string& what) {
  std::string message = absl::StrCat(what, " (UCX: ", ucs_status_string(status), ")");
  switch (status) {
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT: return absl::ResourceExhaustedError(message);
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT: return absl::DeadlineExceededError(message);
    case UCS_ERR_CANCELED: return absl::CancelledError(message);
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_UNSUPPORTED:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NOT_CONNECTED: return absl::UnavailableError(message);
    default: return absl::InternalError(message);
  }
}

}  // namespace dlasync::remote_detail

namespace dlasync {

absl::StatusOr<std::shared_ptr<ucx_worker>> ucx_worker::create(
    const asio::any_io_executor& executor, const std::string& transports, features f) {
  std::shared_ptr<ucx_worker> w(new ucx_worker());
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return remote_detail::ucx_error(s, "reading UCX's configuration failed");
  }
  w->peer_failure_ = !shared_memory_only(transports);
  if (!transports.empty()) {
    // Connections made through a listener need UCX's TCP connection
    // manager, which a shared-memory list alone does not bring; the bytes
    // still move over shared memory (endpoints without peer error handling
    // prefer it).
    const std::string list = w->peer_failure_ ? transports : transports + ",tcp";
    if (ucs_status_t s = ucp_config_modify(config, "TLS", list.c_str()); s != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat("remote_node_options::transports = \"", transports,
                       "\" is not a UCX transport list (UCX: ", ucs_status_string(s),
                       "); use UCX_TLS's syntax, such as \"shm\", \"tcp\" or \"sm,tcp\""));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // RMA only on request: with it, UCX 1.13 serves its software RMA (get and
  // put requests over active messages, as over TCP) to every connected
  // peer, at any address of this process, whatever was registered.
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | (f.rma ? UCP_FEATURE_RMA : 0);
  w->rma_ = f.rma;
  params.mt_workers_shared = 1;
  ucs_status_t s = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (s != UCS_OK) {
    w->context_ = nullptr;
    return remote_detail::ucx_error(s, "UCX could not start (ucp_init)");
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_CLIENT_ID;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  // Sent with each connection (connect): the listener accepts it with the
  // same peer error handling, which UCX requires of both ends.
  wp.client_id = w->peer_failure_ ? 1 : 0;
  if (s = ucp_worker_create(w->context_, &wp, &w->worker_); s != UCS_OK) {
    w->worker_ = nullptr;
    return remote_detail::ucx_error(s, "UCX could not create a worker");
  }
  ucp_address_t* address = nullptr;
  std::size_t length = 0;
  if (s = ucp_worker_get_address(w->worker_, &address, &length); s != UCS_OK) {
    return remote_detail::ucx_error(s, "UCX could not give its worker's address");
  }
  w->address_.assign(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(w->worker_, address);

  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(w->context_, &attr) == UCS_OK) {
    w->cuda_memory_ = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }
  if (absl::Status claimed = w->claim_am_ids(); !claimed.ok()) return claimed;
  int fd = -1;
  if (s = ucp_worker_get_efd(w->worker_, &fd); s != UCS_OK) {
    return remote_detail::ucx_error(s, "UCX gave no event descriptor for its worker");
  }
  w->events_ = std::make_unique<asio::posix::stream_descriptor>(executor, fd);
  return w;
}

ucx_worker::~ucx_worker() {
  finalize();
}

ucs_status_t ucx_worker::send_am(ucp_ep_h ep, am_message m, send_done done) {
  sends_.emplace_front();
  pending_send& p = sends_.front();
  p.owner = this;
  p.self = sends_.begin();
  p.ep = ep;
  p.sent_on = ep;
  p.message = std::move(m);
  p.done = std::move(done);
  const am_message& msg = p.message;
  const std::byte* header = msg.bytes.data();
  const void* data = msg.data != nullptr ? msg.data : header + msg.header_bytes;
  const std::size_t data_bytes =
      msg.data != nullptr ? msg.data_bytes : msg.bytes.size() - msg.header_bytes;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    ucp_request_free(request);
    auto* sent = static_cast<pending_send*>(user_data);
    sent->owner->end_send(sent->self, status);
  };
  param.user_data = &p;
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = msg.reply ? UCP_AM_SEND_FLAG_REPLY : 0;
  if (msg.carried_by == am_message::protocol::eager) param.flags |= UCP_AM_SEND_FLAG_EAGER;
  if (msg.carried_by == am_message::protocol::rendezvous) param.flags |= UCP_AM_SEND_FLAG_RNDV;
  ucs_status_ptr_t r =
      ucp_am_send_nbx(ep, msg.id, header, msg.header_bytes, data, data_bytes, &param);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) return UCS_INPROGRESS;
  // Over inside the call: UCX will not run the callback.
  const ucs_status_t status = UCS_PTR_STATUS(r);
  end_send(p.self, status);
  return status;
}

void ucx_worker::end_send(std::list<pending_send>::iterator sent, ucs_status_t status) {
  send_done finished = std::move(sent->done);
  sends_.erase(sent);
  if (finished) finished(status);
}

void ucx_worker::close_endpoint(ucp_ep_h ep, bool flush) {
  for (pending_send& p : sends_) {
    if (p.ep == ep) p.ep = nullptr;  // closed: finalize() leaves it alone
  }
  closing_.push_back(closing{this, ep, nullptr});
  closing& c = closing_.back();
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.flags = flush ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
  param.cb.send = [](void* request, ucs_status_t, void* user_data) {
    auto* c = static_cast<closing*>(user_data);
    ucx_worker* self = c->owner;
    const ucp_ep_h closed_ep = c->ep;
    self->closing_.remove_if([c](const closing& x) { return &x == c; });
    ucp_request_free(request);
    self->closed(closed_ep);
  };
  param.user_data = &c;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    c.request = r;
    return;
  }
  closing_.pop_back();  // closed inside the call
  closed(ep);
}

void ucx_worker::closed(ucp_ep_h ep) {
  // Collected first: a completion may start or end other sends.
  std::vector<send_done> ended;
  for (pending_send& p : sends_) {
    if (p.sent_on == ep && p.done) ended.push_back(std::exchange(p.done, nullptr));
  }
  for (send_done& d : ended) d(UCS_ERR_CANCELED);
}

void ucx_worker::settle_closes() {
  if (worker_ == nullptr) return;
  // Force-closed endpoints finish at once; a bounded wait all the same.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!closing_.empty() && std::chrono::steady_clock::now() < until) {
    ucp_worker_progress(worker_);
  }
}

void ucx_worker::finalize() {
  stop_listening();
  if (worker_ != nullptr) {
    // An endpoint left open with a send under way (a reply endpoint, which
    // UCX made) is closed first: UCX 1.13 aborts the process when it
    // destroys such an endpoint with a rendezvous pending. Collected first:
    // a close may end sends, which leave the list.
    std::vector<ucp_ep_h> open;
    for (const pending_send& p : sends_) {
      if (p.ep != nullptr && std::find(open.begin(), open.end(), p.ep) == open.end()) {
        open.push_back(p.ep);
      }
    }
    for (ucp_ep_h ep : open) close_endpoint(ep);
  }
  settle_closes();
  stopped_ = true;
  if (events_) {
    asio::error_code ignored;
    events_->cancel(ignored);
    // The descriptor is UCX's: never closed here.
    (void)events_->release();
    events_.reset();
  }
  if (worker_ != nullptr) ucp_worker_destroy(std::exchange(worker_, nullptr));
  if (context_ != nullptr) ucp_cleanup(std::exchange(context_, nullptr));
  // Requests went with the worker; nothing reads the messages any more.
  closing_.clear();
  sends_.clear();
}

std::string ucx_worker::transports() const {
  // ucp_worker_print_info writes a report; its "# lane[...]" lines are not
  // there before endpoints exist, so the context's resources are listed.
  char* text = nullptr;
  std::size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (f == nullptr) return "unknown";
  ucp_context_print_info(context_, f);
  std::fclose(f);
  std::string out;
  std::string report(text, size);
  std::free(text);  // NOLINT(cppcoreguidelines-no-malloc): open_memstream's buffer
  // Lines look like "#      resource 3  :  md 1  dev 1  flags -- tcp/lo".
  std::size_t pos = 0;
  while ((pos = report.find("resource", pos)) != std::string::npos) {
    const std::size_t eol = report.find('\n', pos);
    const std::string line = report.substr(pos, eol - pos);
    const std::size_t name = line.rfind(' ');
    if (name != std::string::npos && line.find("flags") != std::string::npos) {
      if (!out.empty()) out += ",";
      out += line.substr(name + 1);
    }
    if (eol == std::string::npos) break;
    pos = eol;
  }
  return out.empty() ? "unknown" : out;
}

ucs_status_t ucx_worker::on_unclaimed(void* arg, const void*, std::size_t, void*, std::size_t,
                                      const ucp_am_recv_param_t*) {
  // Under the mutex, as every UCX callback: a plain count is enough.
  ++static_cast<ucx_worker*>(arg)->dropped_;
  return UCS_OK;  // UCX releases the data (a rendezvous is never fetched)
}

absl::Status ucx_worker::claim_am_ids() {
  // UCX 1.13 grows its table of handlers without initialising the slots
  // between the last id registered and the table's new capacity
  // (ucp_worker_set_am_handler_common initialises the new id's slot again
  // and again), and reads a slot's flags before it checks the id against the
  // table's length (ucp_am_handler_common). A peer's message with an id in a
  // slot never set calls whatever bytes are there; one past the table reads
  // past its end. So every id the wire can carry gets a handler of ours,
  // registered in increasing order: the table then doubles to exactly
  // max_am_ids slots, each one set.
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  p.cb = &ucx_worker::on_unclaimed;
  p.arg = this;
  p.flags = 0;  // fragments dropped as they come, never assembled
  for (unsigned id = 0; id < max_am_ids; ++id) {
    p.id = id;
    if (ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &p); s != UCS_OK) {
      return remote_detail::ucx_error(
          s, absl::StrCat("UCX refused the handler that drops active message ", id));
    }
  }
  return absl::OkStatus();
}

absl::Status ucx_worker::set_am_handler(unsigned id, ucp_am_recv_callback_t cb, void* arg) {
  if (id >= max_am_ids) {
    return absl::InvalidArgumentError(absl::StrCat(
        "active message id ", id, " does not fit UCX's 16-bit id; use one below ", max_am_ids));
  }
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  p.id = id;
  p.cb = cb;
  p.arg = arg;
  p.flags = UCP_AM_FLAG_WHOLE_MSG;
  if (ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &p); s != UCS_OK) {
    return remote_detail::ucx_error(s,
                                    absl::StrCat("UCX refused a handler for active message ", id));
  }
  return absl::OkStatus();
}

void ucx_worker::start() {
  std::lock_guard lock(mutex_);
  progress();
  watch();
}

void ucx_worker::progress() {
  // Called again from inside UCX's callbacks (which start operations): the
  // outer call goes on progressing until idle, so it has nothing to do.
  if (stopped_ || progressing_) return;
  progressing_ = true;
  // Bounded: peers that never stop sending must not keep this thread, and
  // the lock, for good. What is left goes on from the executor.
  bool idle = false;
  for (unsigned rounds = 0; rounds < max_progress_rounds;) {
    while (rounds < max_progress_rounds && ucp_worker_progress(worker_) != 0) ++rounds;
    if (rounds == max_progress_rounds) break;
    ++rounds;
    if (ucp_worker_arm(worker_) != UCS_ERR_BUSY) {
      idle = true;
      break;
    }
  }
  progressing_ = false;
  if (!idle && events_) {
    asio::post(events_->get_executor(), [weak = weak_from_this()] {
      if (std::shared_ptr<ucx_worker> self = weak.lock()) self->on_readable(false, {});
    });
  }
}

void ucx_worker::watch() {
  if (!waiting_) {
    waiting_ = true;
    events_->async_wait(asio::posix::stream_descriptor::wait_read,
                        [weak = weak_from_this()](const asio::error_code& ec) {
                          if (std::shared_ptr<ucx_worker> self = weak.lock()) {
                            self->on_readable(true, ec);
                          }
                        });
  }
  // Asio watches descriptors edge-triggered, and an async_wait is never
  // completed from readiness seen before it was made: an event that came
  // between the last arm and the wait's registration would be lost, and the
  // worker would sleep with work pending. So look once, now that the wait is
  // in place, and progress again if the descriptor is readable already.
  pollfd p{events_->native_handle(), POLLIN, 0};
  if (::poll(&p, 1, 0) > 0) {
    asio::post(events_->get_executor(), [weak = weak_from_this()] {
      if (std::shared_ptr<ucx_worker> self = weak.lock()) self->on_readable(false, {});
    });
  }
}

void ucx_worker::on_readable(bool from_wait, const asio::error_code& ec) {
  std::lock_guard lock(mutex_);
  if (from_wait) waiting_ = false;
  if (stopped_ || ec) return;  // operation_aborted: stopped
  progress();
  watch();
}

void ucx_worker::stop() {
  stopped_ = true;
  asio::error_code ignored;
  if (events_) events_->cancel(ignored);
}

}  // namespace dlasync
