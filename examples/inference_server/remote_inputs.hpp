// Inputs that come as one remote bundle: a client publishes a request's
// input tensors together (dlasync::remote_node::publish_bundle), sends the
// encoded bundle in the request's dlasync_bundle parameter (base64) and
// names a member in each input's dlasync_bundle_member parameter; the
// server fetches the members the inputs name with one hold, every member's
// bytes in flight together, and one release (dlasync::import_remote_bundle).
//
// The bundle is untrusted input, checked before anything is fetched:
//   InvalidArgument   bytes that are no bundle (remote_bundle::decode's
//                     errors), a member named twice, or an input whose
//                     datatype or shape is not its member's;
//   OutOfRange        a member past the bundle's;
//   PermissionDenied  an exporter other than the host the request came
//                     from: the server never connects where a request
//                     tells it to, only back to the sender; or a port of
//                     the sender's outside the ports the server fetches
//                     from (by default none below 1024);
// then what import_remote_bundle says (NotFound for a lease that has ended,
// Unavailable for an exporter that cannot be reached, DeadlineExceeded
// past the import's timeout...), each naming the request's bundle. The
// fetched bytes are copies owned by the server, taken from the runtime's
// copy budget.
//
// Thread safety: fetch() may run from any number of coroutines at once;
// shutdown() from a thread that is not the runtime's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "dlasync/remote.hpp"
#include "kserve_service.hpp"

namespace dlasync::examples::kserve {

class remote_inputs final : public bundle_fetcher {
 public:
  struct options {
    std::string transports;  // UCX_TLS's syntax; empty: UCX's choice
    // How long fetching one request's bundle may take.
    std::chrono::milliseconds timeout{std::chrono::seconds(10)};
    // The exporter ports a bundle may name on the sender's host. By default
    // none below 1024: a request cannot make the server open a connection
    // to the sender's privileged services (ssh, http, the server's own when
    // the sender is local). Narrow it to the ports the clients' nodes
    // listen on.
    std::uint16_t min_port = 1024;
    std::uint16_t max_port = 65535;
  };

  // A node of `rt` that imports (it publishes nothing, so it has no
  // listener): the errors of dlasync::remote_node::create.
  static absl::StatusOr<std::unique_ptr<remote_inputs>> create(runtime& rt, const options& o);
  ~remote_inputs() override;

  asio::awaitable<absl::Status> fetch(infer_request& r, std::string peer) override;

  // Fetches under way fail with Cancelled; see remote_node::shutdown.
  void shutdown();

 private:
  remote_inputs(std::unique_ptr<remote_node> node, const options& o)
      : node_(std::move(node)), min_port_(o.min_port), max_port_(o.max_port) {}

  std::unique_ptr<remote_node> node_;
  std::uint16_t min_port_;
  std::uint16_t max_port_;
};

}  // namespace dlasync::examples::kserve
