#include <cstring>

#include "absl/strings/str_cat.h"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/post.hpp"
#include "server_stats.hpp"
#include "ucx_front_state.hpp"

namespace dlasync::examples {

void ucx_front::state::reply_locked(connection& c, std::uint64_t tag,
                                    absl::StatusOr<std::string> answer) {
  const absl::StatusCode code = answer.status().code();
  count(code);
  if (stopped || !c.alive) return;
  ucx_worker::am_message m;
  m.id = ucx_response_am;
  const auto header = ucx_response_header(tag, code).encode();
  m.bytes.assign(header.begin(), header.end());
  m.header_bytes = header.size();
  // The data is sent from the answer's own bytes, kept until the send ends.
  auto data = std::make_shared<const std::string>(
      answer.ok() ? *std::move(answer) : std::string(answer.status().message()));
  m.data = data->data();
  m.data_bytes = data->size();
  // REPLY: the client learns which of its connections the answer is for.
  m.reply = true;
  (void)ucx->send_am(c.ep, std::move(m), [data](ucs_status_t) {});
  ucx->progress();
}

ucs_status_t ucx_front::state::on_request(void* arg, const void* header, std::size_t header_length,
                                          void* data, std::size_t length,
                                          const ucp_am_recv_param_t* param) {
  auto* self = static_cast<state*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0) return UCS_OK;  // no way back
  if (self->stopping) return UCS_OK;
  auto it = self->connections.find(param->reply_ep);
  if (it == self->connections.end()) return UCS_OK;  // not a connection of ours
  connection& c = *it->second;
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  // Refusals drop the data: a rendezvous payload is never transferred.
  auto refuse = [&](std::uint64_t tag, const absl::Status& why) {
    self->reply_locked(c, tag, why);
    return UCS_OK;
  };
  const std::optional<ucx_header> h =
      ucx_header::decode(std::span(static_cast<const std::byte*>(header), header_length));
  if (!h) {
    return refuse(0,
                  absl::InvalidArgumentError(absl::StrCat(
                      "a UCX request's header holds ", header_length, " bytes; it must be the ",
                      ucx_header_bytes, "-byte header: magic \"KV2Q\", a reserved word, the tag")));
  }
  if (h->magic != ucx_request_magic || h->word != 0) {
    return refuse(h->tag,
                  absl::InvalidArgumentError(absl::StrCat(
                      "a UCX request's header has magic 0x", absl::Hex(h->magic),
                      " and reserved word ", h->word, "; a request's magic is 0x",
                      absl::Hex(ucx_request_magic), " (\"KV2Q\") and its reserved word 0")));
  }
  if (length > self->opts.max_body) {
    return refuse(h->tag,
                  absl::OutOfRangeError(absl::StrCat(
                      "a request message of ", length, " bytes exceeds the limit of ",
                      self->opts.max_body, " bytes (--max_request_mib): send less at once")));
  }
  const auto total = static_cast<std::uint32_t>(length);
  // Refused before its data is taken: no copy of an eager body is made.
  if (total > self->budget->limit()) {
    return refuse(h->tag, over_whole_budget(total, self->budget->limit()));
  }
  if (total > self->opts.connection_budget) {
    return refuse(h->tag, absl::ResourceExhaustedError(absl::StrCat(
                              "request of ", total, " bytes exceeds the per-connection budget of ",
                              self->opts.connection_budget,
                              " bytes (--connection_budget_mib): send smaller tensors")));
  }
  return self->admit(it->second, h->tag, total, data, length, rendezvous);
}

ucs_status_t ucx_front::state::admit(const std::shared_ptr<connection>& c, std::uint64_t tag,
                                     std::uint32_t total, void* data, std::size_t length,
                                     bool rendezvous) {
  auto r = std::make_shared<ucx_request>();
  r->owner = this;
  r->conn = c;
  r->tag = tag;
  r->length = total;
  // A body that fits now is granted at once; one that must wait for room
  // counts against the connection's queue, whose bounds keep a peer from
  // piling up copies outside the budget.
  const bool now = budget->try_acquire(total);
  const std::uint64_t held = rendezvous ? 0 : length;
  if (!now) {
    if (c->queued >= opts.max_queued_requests) {
      refused_queue.fetch_add(1);
      reply_locked(*c, tag,
                   absl::ResourceExhaustedError(absl::StrCat(
                       "this connection has ", c->queued,
                       " requests waiting for room in the memory budget, the most it may "
                       "(--max_queued_requests=",
                       opts.max_queued_requests, "): wait for answers before sending more")));
      return UCS_OK;
    }
    if (c->queued_bytes + held > opts.max_queued_bytes) {
      refused_queue.fetch_add(1);
      reply_locked(*c, tag,
                   absl::ResourceExhaustedError(absl::StrCat(
                       "this connection's requests waiting for room in the memory budget hold ",
                       c->queued_bytes, " bytes, and this one ", held, " more: past the ",
                       opts.max_queued_bytes, " bytes it may hold (--max_queued_kib=",
                       opts.max_queued_bytes >> 10, "): wait for answers before sending more")));
      return UCS_OK;
    }
    r->queued = true;
    r->held = held;
    ++c->queued;
    c->queued_bytes += held;
  }
  if (rendezvous) {
    r->rendezvous = data;
  } else if (length > 0) {
    const auto* d = static_cast<const std::byte*>(data);
    r->eager.assign(d, d + length);
  }
  requests.emplace(r.get(), r);
  // The grant (or the refusal of a body larger than the whole budget)
  // continues on the executor, never inside UCX's callback.
  auto go_on = [weak = weak_from_this(), r](absl::Status s) {
    std::shared_ptr<state> st = weak.lock();
    if (st == nullptr) return;
    asio::post(st->executor, [st, r, s = std::move(s)] { st->granted(r, s); });
  };
  if (now) {
    go_on(absl::OkStatus());
  } else {
    r->ticket = budget->acquire(total, std::move(go_on));
  }
  return rendezvous ? UCS_INPROGRESS : UCS_OK;
}

void ucx_front::state::leave_queue(ucx_request& r) {
  if (!r.queued) return;
  r.queued = false;
  --r.conn->queued;
  r.conn->queued_bytes -= r.held;
}

void ucx_front::state::release_rendezvous(ucx_request& r) {
  if (r.rendezvous != nullptr && !stopped) ucp_am_data_release(ucx->worker(), r.rendezvous);
  r.rendezvous = nullptr;
}

std::shared_ptr<ucx_request> ucx_front::state::forget(ucx_request* r) {
  auto it = requests.find(r);
  if (it == requests.end()) return nullptr;
  std::shared_ptr<ucx_request> kept = std::move(it->second);
  requests.erase(it);
  return kept;
}

void ucx_front::state::granted(const std::shared_ptr<ucx_request>& r, const absl::Status& status) {
  std::lock_guard lock(ucx->mutex());
  leave_queue(*r);
  forget(r.get());
  if (stopping || !r->conn->alive) {
    if (status.ok()) budget->release(r->length);
    release_rendezvous(*r);
    return;
  }
  if (!status.ok()) {
    release_rendezvous(*r);
    // (A request larger than the whole budget never gets here: on_request
    // refuses it.)
    reply_locked(*r->conn, r->tag,
                 absl::Status(status.code(), absl::StrCat("request of ", r->length,
                                                          " bytes: ", status.message())));
    return;
  }
  // The body's room goes back to the budget when its last holder lets go.
  r->body.room =
      std::shared_ptr<void>(nullptr, [b = budget, n = r->length](void*) { b->release(n); });
  r->body.bytes = std::make_unique_for_overwrite<std::byte[]>(r->length);
  r->body.length = r->length;
  if (r->rendezvous == nullptr) {
    // (memcpy takes no null pointer, which an empty vector may give.)
    if (!r->eager.empty()) std::memcpy(r->body.bytes.get(), r->eager.data(), r->eager.size());
    return run_handler(r->conn, r->tag, std::move(r->body));
  }
  receive(r);
}

void ucx_front::state::receive(const std::shared_ptr<ucx_request>& r) {
  requests.emplace(r.get(), r);
  r->receiving = true;
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  rp.cb.recv_am = [](void* request, ucs_status_t s, std::size_t, void* user_data) {
    ucp_request_free(request);
    auto* done = static_cast<ucx_request*>(user_data);
    done->owner->received(done, s);
  };
  rp.user_data = r.get();
  // UCX owns the descriptor from here on; the callback may run inside.
  void* descriptor = std::exchange(r->rendezvous, nullptr);
  ucs_status_ptr_t s =
      ucp_am_recv_data_nbx(ucx->worker(), descriptor, r->body.bytes.get(), r->length, &rp);
  if (!UCS_PTR_IS_PTR(s)) {
    received(r.get(), UCS_PTR_STATUS(s));  // over inside the call: no callback
  } else if (r->receiving && opts.read_timeout.count() > 0) {
    // The body must arrive within the read deadline of its grant, as over
    // HTTP: a peer that stops sending would hold its room for good.
    r->deadline = std::make_unique<asio::steady_timer>(executor, opts.read_timeout);
    // Weak: the request owns the timer.
    r->deadline->async_wait([weak = weak_from_this(),
                             late = std::weak_ptr<ucx_request>(r)](const asio::error_code& ec) {
      std::shared_ptr<state> st = weak.lock();
      std::shared_ptr<ucx_request> request = late.lock();
      if (!ec && st != nullptr && request != nullptr) st->past_deadline(request);
    });
  }
  ucx->progress();
}

void ucx_front::state::received(ucx_request* r, ucs_status_t status) {
  if (!r->receiving) return;
  r->receiving = false;
  if (r->deadline) r->deadline->cancel();
  const std::shared_ptr<ucx_request> kept = forget(r);
  ucx_front::message body = std::move(r->body);
  if (status == UCS_OK && !stopping && r->conn->alive) {
    run_handler(r->conn, r->tag, std::move(body));
  }
  // Otherwise the body goes, and its bytes back to the budget.
}

void ucx_front::state::past_deadline(const std::shared_ptr<ucx_request>& r) {
  std::lock_guard lock(ucx->mutex());
  if (stopped || !r->receiving || !r->conn->alive) return;
  closed_late.fetch_add(1);
  reply_locked(*r->conn, r->tag,
               absl::DeadlineExceededError(absl::StrCat(
                   "the request's body did not arrive within ", opts.read_timeout.count(),
                   " ms (--read_timeout_ms); closing the connection")));
  // Closing the endpoint ends its receives (UCX completes them as
  // cancelled), and their bodies go back to the budget.
  close_connection(r->conn, /*from_ucx=*/false);
  ucx->progress();
}

void ucx_front::state::run_handler(const std::shared_ptr<connection>& c, std::uint64_t tag,
                                   ucx_front::message body) {
  bytes_in.fetch_add(ucx_header_bytes + body.length);
  body.peer = c->peer;
  {
    std::lock_guard lock(running_mutex);
    ++running;
  }
  // Posted: co_spawn would start the handler right here, under the lock.
  asio::post(executor, [self = shared_from_this(), c, tag, body = std::move(body)]() mutable {
    asio::co_spawn(
        self->executor,
        [self, c, tag, body = std::move(body)]() mutable -> asio::awaitable<void> {
          absl::StatusOr<std::string> answer = absl::InternalError("unanswered");
          try {
            answer = co_await self->handle(std::move(body));
          } catch (const std::exception& e) {
            // Answered, and counted as ended, whatever the handler threw
            // (out of memory in a parse): stop() waits for every handler.
            answer = absl::InternalError(absl::StrCat("the request failed: ", e.what()));
          }
          {
            std::lock_guard lock(self->ucx->mutex());
            self->reply_locked(*c, tag, std::move(answer));
          }
          std::lock_guard lock(self->running_mutex);
          if (--self->running == 0) self->running_done.notify_all();
        },
        asio::detached);
  });
}

}  // namespace dlasync::examples
