// ucx_worker's connections through UCX's TCP connection manager: listen,
// accept, reject, connect. A peer is named by an address and a port; its
// packed worker address never comes from outside (UCX exchanges it itself,
// between its own connection managers).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "remote/src/numeric_address.hpp"
#include "remote/src/ucx_error.hpp"
#include "remote/src/ucx_worker.hpp"

namespace dlasync {
namespace {

// A numeric IPv4 or IPv6 address and a port, as a sockaddr.
struct socket_address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

absl::StatusOr<socket_address> parse(const std::string& address, std::uint16_t port) {
  socket_address out;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
  const std::optional<remote_detail::numeric_address> a = remote_detail::parse_address(address);
  if (a && a->v4) {
    v4->sin_family = AF_INET;
    std::memcpy(&v4->sin_addr, a->bytes.data(), sizeof(v4->sin_addr));
    v4->sin_port = htons(port);
    out.length = sizeof(sockaddr_in);
  } else if (a) {
    v6->sin6_family = AF_INET6;
    std::memcpy(&v6->sin6_addr, a->bytes.data(), sizeof(v6->sin6_addr));
    v6->sin6_port = htons(port);
    out.length = sizeof(sockaddr_in6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", address, "\" is not a numeric IPv4 or IPv6 address; give one, such as 127.0.0.1"));
  }
  return out;
}

// Peer error handling (`peer`), and the handler of errors when there is one.
void handle_errors(ucp_ep_params_t& p, bool peer, ucp_err_handler_cb_t on_error, void* arg) {
  p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  p.err_mode = peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  if (on_error == nullptr) return;
  p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.err_handler.cb = on_error;
  p.err_handler.arg = arg;
}

}  // namespace

bool ucx_worker::shared_memory_only(const std::string& transports) {
  if (transports.empty()) return false;
  for (absl::string_view t : absl::StrSplit(transports, ',', absl::SkipEmpty())) {
    if (t != "shm" && t != "sm" && t != "posix" && t != "sysv" && t != "cma" && t != "knem" &&
        t != "xpmem" && t != "self") {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::uint16_t> ucx_worker::listen(const std::string& address, std::uint16_t port,
                                                 ucp_listener_conn_callback_t on_request,
                                                 void* arg) {
  if (listener_ != nullptr) {
    return absl::FailedPreconditionError("this UCX worker listens already");
  }
  absl::StatusOr<socket_address> a = parse(address, port);
  if (!a.ok()) return a.status();
  ucp_listener_params_t p{};
  p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  p.sockaddr.addr = a->get();
  p.sockaddr.addrlen = a->length;
  p.conn_handler.cb = on_request;
  p.conn_handler.arg = arg;
  if (ucs_status_t s = ucp_listener_create(worker_, &p, &listener_); s != UCS_OK) {
    listener_ = nullptr;
    return absl::UnavailableError(absl::StrCat("UCX cannot listen on ", address, " port ", port,
                                               " (UCX: ", ucs_status_string(s),
                                               "); give an address of this host and a free port"));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucs_status_t s = ucp_listener_query(listener_, &attr); s != UCS_OK) {
    return remote_detail::ucx_error(s, "UCX does not say which port it listens on");
  }
  if (attr.sockaddr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
}

absl::StatusOr<ucp_ep_h> ucx_worker::accept(ucp_conn_request_h request,
                                            ucp_err_handler_cb_t on_error, void* arg) {
  // UCX 1.13 refuses an endpoint whose peer error handling differs from
  // its peer's; the connecting worker says which it uses in its client id
  // (create). Without one, this worker's own.
  bool peer = peer_failure_;
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ID;
  if (ucp_conn_request_query(request, &attr) == UCS_OK) peer = (attr.client_id & 1) != 0;
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  p.conn_request = request;
  handle_errors(p, peer, on_error, arg);
  ucp_ep_h ep = nullptr;
  if (ucs_status_t s = ucp_ep_create(worker_, &p, &ep); s != UCS_OK) {
    return remote_detail::ucx_error(s, "UCX could not accept a connection");
  }
  return ep;
}

void ucx_worker::reject(ucp_conn_request_h request) {
  if (listener_ != nullptr) ucp_listener_reject(listener_, request);
}

void ucx_worker::stop_listening() {
  if (listener_ != nullptr) ucp_listener_destroy(std::exchange(listener_, nullptr));
}

absl::StatusOr<ucp_ep_h> ucx_worker::connect(const std::string& address, std::uint16_t port,
                                             ucp_err_handler_cb_t on_error, void* arg) {
  if (port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("port 0 at ", address, ": a listener's port is never 0"));
  }
  absl::StatusOr<socket_address> a = parse(address, port);
  if (!a.ok()) return a.status();
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER | UCP_EP_PARAMS_FLAGS_SEND_CLIENT_ID;
  p.sockaddr.addr = a->get();
  p.sockaddr.addrlen = a->length;
  handle_errors(p, peer_failure_, on_error, arg);
  ucp_ep_h ep = nullptr;
  if (ucs_status_t s = ucp_ep_create(worker_, &p, &ep); s != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("UCX cannot connect to ", address, " port ", port,
                                               " (UCX: ", ucs_status_string(s), ")"));
  }
  return ep;
}

}  // namespace dlasync
