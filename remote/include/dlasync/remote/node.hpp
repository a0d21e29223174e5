// dlasync/remote/node.hpp
//
// `dlasync::remote_node` is a runtime's door to other processes and other
// machines, over UCX. It owns one UCX context and one UCX worker, driven by
// the worker's event file descriptor on the runtime's Asio executor: no
// thread spins, and no thread of its own waits. A runtime has at most one
// node; the node must be destroyed (or shut down) before its runtime.
//
// Exporting. `publish` takes an imported tensor or a DLPack managed tensor,
// registers the memory its strides reach with UCX (ucp_mem_map) and returns a
// `remote_descriptor` (descriptor.hpp) that any channel can carry. The
// publication is a lease: the tensor stays alive, and its producer's deleter
// waits, until `importers` importers have fetched it and released their
// hold (a UCX active message), or until the lease ends, or until the node
// shuts down, whichever comes first. Then the memory is unregistered and the
// producer's deleter runs, exactly once.
//
// Importing. `async_import_remote` (and the awaitable `import_remote`)
// validates a descriptor exactly as a local import validates a tensor, asks
// the exporter for a hold on the lease, moves the bytes with UCX (an RMA get
// where the endpoint has a native RMA lane, else active messages that the
// exporter answers with the bytes) into host memory from the runtime's copy
// budget, releases the hold, and lands the tensor on
// `options.target`: a compact host copy owned by dlasync, or a GPU copy made
// from it by a local import (the staging pipeline), since Debian's UCX has
// no CUDA transports. docs/remote.md has the contract.
//
// Example, both sides:
//
//   auto node = dlasync::remote_node::create(*rt);
//   absl::StatusOr<dlasync::remote_descriptor> d = (*node)->publish(std::move(source));
//   send_to_peer(d->encode());
//   ...
//   auto r = dlasync::remote_descriptor::decode(received);
//   absl::StatusOr<dlasync::tensor> t = co_await dlasync::import_remote(**node, *r);
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "asio/async_result.hpp"
#include "asio/awaitable.hpp"
#include "dlasync/remote/descriptor.hpp"
#include "dlasync/remote/detail/remote_initiation.hpp"
#include "dlasync/runtime/runtime.hpp"
#include "dlasync/transfer/import_options.hpp"
#include "dlasync/transfer/managed_tensor.hpp"
#include "dlasync/transfer/tensor.hpp"

namespace dlasync {

// How an importer moves the bytes (see docs/remote.md).
enum class remote_fetch : std::uint8_t {
  // RMA get over endpoints where UCX has a native RMA lane (cma over shared
  // memory), active messages elsewhere (TCP), where UCX 1.13 would emulate
  // the get in a way that aborts the exporter when its importer is lost.
  automatic,
  // Always RMA get (UCX emulates it where a transport has none).
  rma,
  // Always active messages: the exporter sends each piece, as UCX's
  // rendezvous for large ones.
  active_messages,
};

struct remote_node_options {
  // UCX transports (UCX_TLS's syntax: "shm", "tcp", "sm,tcp"); empty keeps
  // UCX's choice (and the UCX_TLS environment variable).
  std::string transports;
  // How long an import may wait for its exporter (the hold, then each byte
  // of the transfer) before it fails with DeadlineExceeded.
  std::chrono::milliseconds import_timeout{std::chrono::seconds(60)};
  // How imports from this node move the bytes.
  remote_fetch fetch = remote_fetch::automatic;
  // A strided tensor is fetched run by run (one get or request per
  // contiguous run, straight into the compact result) when its runs are at
  // least this long and there are at most 65,536 of them; else as the whole
  // span its strides reach, compacted here afterwards. 0 chooses by path, as
  // measured (docs/remote.md): 4 KiB for RMA gets, 16 KiB for active
  // messages.
  std::uint64_t min_run_bytes = 0;
};

struct publish_options {
  // How many importers will fetch the tensor: the producer's deleter runs
  // after that many have released their hold. At least 1.
  std::uint32_t importers = 1;
  // How long the publication lives at most. When it ends, holds are refused
  // and the memory is released, also under an importer still reading: that
  // importer's import fails with DeadlineExceeded (it checks its hold's end
  // on its own clock, so it never hands out bytes read after the release).
  std::chrono::milliseconds lease{std::chrono::seconds(60)};
};

// What a remote import is asked: the local import's options (target, copy,
// consumer_stream, require_contiguous, require_writable, min_alignment),
// except that the bytes always move, so copy=false is refused, and that
// a remote tensor has no producer stream here, so `stream` must be none.
using remote_import_options = import_options;

class remote_node {
 public:
  using executor_type = runtime::executor_type;

  // InvalidArgument for a bad option; Unavailable when UCX cannot start (its
  // message names UCX's status); FailedPrecondition when `rt` already has a
  // node or is shutting down.
  static absl::StatusOr<std::unique_ptr<remote_node>> create(runtime& rt,
                                                             remote_node_options options = {});

  remote_node(const remote_node&) = delete;
  remote_node& operator=(const remote_node&) = delete;
  // Shuts down (see shutdown).
  ~remote_node();

  runtime& get_runtime() noexcept;
  executor_type get_executor() noexcept;

  // Publishes `source` (consumed only on success: on error the caller keeps
  // it) or an imported tensor (the publication holds a reference). The
  // tensor must be in host memory of this process (cpu, cuda_host), valid as
  // a local import would find it: InvalidArgument, OutOfRange, Unimplemented
  // as plan_import says; Unimplemented for GPU memory, which Debian's UCX
  // cannot register (import it onto cpu:0 and publish that);
  // InvalidArgument for importers = 0 or a lease not above zero;
  // Unavailable after shutdown; Internal when UCX refuses the registration.
  absl::StatusOr<remote_descriptor> publish(managed_tensor& source,
                                            const publish_options& options = {});
  absl::StatusOr<remote_descriptor> publish(const tensor& source,
                                            const publish_options& options = {});

  // Publications whose producer has not been released yet.
  std::size_t publications() const;
  // Remote imports in flight.
  std::size_t imports_in_flight() const;
  // The transports UCX chose for this node's worker, as UCX names them.
  std::string transports() const;

  // Stops: imports in flight fail with Cancelled, every publication is
  // released (its producer's deleter runs), endpoints are closed and UCX is
  // finalised. Idempotent; must not be called from the runtime's threads.
  void shutdown();

  // Internals for the initiating functions.
  detail::remote_core& core() noexcept { return *core_; }

 private:
  explicit remote_node(std::shared_ptr<detail::remote_core> core) noexcept;

  std::shared_ptr<detail::remote_core> core_;
};

// Fetches the tensor `descriptor` names from its exporter and lands it on
// `options.target` (cpu:0 when empty), as an Asio initiating function with
// completion signature void(absl::StatusOr<dlasync::tensor>). Returns
// immediately; the handler is called exactly once, never from inside this
// function, on its associated executor (the runtime's when it has none).
//
// Validation happens when the operation starts, before any byte moves:
// InvalidArgument, OutOfRange, Unimplemented as for a local import
// (rule names as in import_error.hpp), plus InvalidArgument with rule
// "remote_region" when the strides reach outside the registered region,
// "copy" for copy=false, "stream" for a producer stream, and Unimplemented
// for an exporter device other than host memory. Then: NotFound when the
// exporter does not know the lease (released, expired or never published),
// FailedPrecondition when all its importers already hold it, Unavailable
// when the exporter cannot be reached or goes away during the transfer,
// DeadlineExceeded when it does not answer within import_timeout or the
// lease ended while the bytes moved, ResourceExhausted when the copy is
// larger than the whole budget, Cancelled on cancellation or node shutdown.
//
// Cancellation: terminal and partial, through the handler's cancellation
// slot. The handler gets Cancelled at once; the hold is released and the
// buffer freed once UCX no longer writes it.
template <ASIO_COMPLETION_TOKEN_FOR(void(absl::StatusOr<tensor>))
              CompletionToken = dlasync::detail::default_token_t<runtime::executor_type>>
auto async_import_remote(remote_node& node, const remote_descriptor& descriptor,
                         const remote_import_options& options = {},
                         CompletionToken&& token = CompletionToken()) {
  return asio::async_initiate<CompletionToken, void(absl::StatusOr<tensor>)>(
      detail::initiate_remote_import{&node.core(), &node.get_runtime()}, token, descriptor,
      options);
}

#if defined(ASIO_HAS_CO_AWAIT)
// The same, awaited: validation happens when it is awaited.
[[nodiscard]] asio::awaitable<absl::StatusOr<tensor>> import_remote(
    remote_node& node, remote_descriptor descriptor, remote_import_options options = {});
#endif

}  // namespace dlasync
