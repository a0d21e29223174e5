// dlasync/remote.hpp
//
// `dlasync::remote_node` is a runtime's door to other processes and other
// machines, over UCX. It owns one UCX context and one UCX worker, driven by
// the worker's event file descriptor on the runtime's Asio executor: no
// thread spins, and no thread of its own waits. A runtime has at most one
// node; the node must be destroyed (or shut down) before its runtime.
//
// Exporting. `publish` takes an imported tensor or a DLPack managed tensor
// and returns a `remote_descriptor` (below) that any channel can
// carry; importers connect to the node's listener (an address and a port
// the descriptor names). The publication is a lease: the tensor stays
// alive, and its producer's deleter waits, until `importers` importers have
// held it and released their hold, or until the lease ends, or until the
// node shuts down, whichever comes first, and until no byte of it is still
// on its way. Then the producer's deleter runs, exactly once. A hold is
// granted to one importer's connection with a secret: no one else can
// release it. The exporter sends the tensor's bytes itself, cut from its
// own record of the tensor; an importer never names an address it reads
// (docs/security.md).
//
// Bundles. `publish_bundle` publishes several tensors under one lease
// (a `remote_bundle`), and `async_import_remote_bundle` fetches them (or a
// selection) with one hold, every member's bytes in flight together.
//
// Importing. `async_import_remote` (and the awaitable `import_remote`)
// validates a descriptor exactly as a local import validates a tensor,
// connects to the exporter, asks for a hold on the lease, receives the
// bytes into host memory from the runtime's copy budget (checking every
// piece against the descriptor before it writes it), releases the hold,
// and lands the tensor on `options.target`: a compact host copy owned by
// dlasync, or a GPU copy made from it by a local import (the staging
// pipeline), since Debian's UCX has no CUDA transports. Between trusted
// peers the importer may read the bytes by RMA get instead.
// docs/remote.md has the contract.
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
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "asio/async_result.hpp"
#include "asio/awaitable.hpp"
#include "dlasync/detail/remote_initiation.hpp"
#include "dlasync/device.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/dtype.hpp"
#include "dlasync/import_options.hpp"
#include "dlasync/remote_registration.hpp"
#include "dlasync/runtime.hpp"
#include "dlasync/tensor.hpp"

namespace dlasync {

// `dlasync::remote_descriptor` is what an exporting process hands to an
// importing one so that the importer can fetch a published tensor over UCX:
// the tensor's DLPack description as the exporter sees it (dtype, shape,
// strides, byte offset, flags, device), where its bytes lie in the
// exporter's address space (the tensor's data pointer and the region the
// strides reach), the exporter's listener (an address and a port), the
// lease that keeps the memory alive, and, only where the exporter trusts
// its peers with RMA, the packed UCX remote key of the region.
// Any channel can carry it: `encode` gives a self-contained byte string,
// `decode` reads one back.
//
// A descriptor that arrives from elsewhere is untrusted. `decode` checks the
// framing (magic, format version, lengths, no trailing bytes, ndim within
// max_ndim, an address of 4 or 16 bytes); import_remote then validates the
// description exactly as a local import validates a DLPack tensor (shape,
// strides, dtype, offset, overflow), and checks that the span the strides
// reach lies inside the region, before any byte moves. The description
// grants nothing by itself: the exporter sends only the bytes of the tensor
// it published under the lease, and refuses a hold asked for with a
// description that is not that tensor's (docs/security.md).
//
// Example, the exporter's side and the importer's side of a channel:
//
//   absl::StatusOr<dlasync::remote_descriptor> d = node.publish(std::move(source));
//   channel.send(d->encode());
//   ...
//   absl::StatusOr<dlasync::remote_descriptor> r = dlasync::remote_descriptor::decode(bytes);
//   if (!r.ok()) return r.status();  // InvalidArgument, naming the byte
//
// Thread safety: a value type. Distinct objects: safe. Shared objects: safe
// for concurrent const use.

struct remote_descriptor {
  // The format `encode` writes; `decode` refuses others.
  static constexpr std::uint16_t format_version = 2;
  // Bounds on the opaque UCX blobs (`decode` refuses longer ones).
  static constexpr std::uint32_t max_blob_bytes = 64 * 1024;

  // The publication this descriptor names at its exporter.
  std::uint64_t lease_id = 0;
  // The DLPack version the exporter's tensor carried.
  std::uint32_t dlpack_major = 1;
  std::uint32_t dlpack_minor = 3;
  // The device the tensor lives on, in the exporter's process.
  device source_device = host_device;
  dtype type = dtypes::float32;
  std::vector<std::int64_t> shape;
  // Strides in elements, always ndim of them.
  std::vector<std::int64_t> strides;
  std::uint64_t byte_offset = 0;
  // The versioned DLPack flags the exporter's tensor carried.
  std::uint64_t flags = 0;
  // DLTensor::data in the exporter's address space; the first element is
  // at data + byte_offset.
  std::uint64_t data = 0;
  // The region, [region_begin, region_begin + region_bytes): every byte
  // the strides reach lies inside it. Empty for size-0 tensors.
  std::uint64_t region_begin = 0;
  std::uint64_t region_bytes = 0;
  // The exporter's listener: a numeric IPv4 or IPv6 address and a port
  // (remote_node_options::listen_address, listen_port).
  std::string exporter_address;
  std::uint16_t exporter_port = 0;
  // The packed UCX remote key of the region (ucp_rkey_pack), only from an
  // exporter whose node trusts its peers (remote_node_options::
  // trusted_peers); empty otherwise.
  std::string rkey;

  // The descriptor as bytes: little-endian, self-delimiting.
  std::string encode() const;

  // Reads `bytes` back. InvalidArgument for anything malformed (wrong magic,
  // another format version, a length past the end, trailing bytes, an
  // exporter address of neither 4 nor 16 bytes), naming the field and the
  // byte; OutOfRange for ndim above max_ndim or a blob above
  // max_blob_bytes. The description itself is checked by the import.
  static absl::StatusOr<remote_descriptor> decode(std::string_view bytes);
};

// `dlasync::remote_bundle` names several tensors published together under
// one lease (remote_node::publish_bundle): one hold, every member's bytes
// in flight together, one release. Its members are remote descriptors
// whose lease and exporter are the bundle's; each keeps its index in the
// published bundle, so that a bundle of some members (`select`) asks the
// exporter for exactly those. `encode` writes the lease and the exporter
// once, each distinct remote key once (members that share a registration
// share its key), then each member's description and the key it names;
// `decode` checks the framing as remote_descriptor::decode does, that the
// indices rise and lie below `published`, and that every key is named and
// every name is a key. async_import_remote_bundle fetches them.
//
// Example:
//
//   absl::StatusOr<dlasync::remote_bundle> b = node.publish_bundle(sources);
//   channel.send(b->encode());
//   ...
//   absl::StatusOr<dlasync::remote_bundle> r = dlasync::remote_bundle::decode(bytes);
//   absl::StatusOr<std::vector<dlasync::tensor>> ts =
//       co_await dlasync::import_remote_bundle(node, *r);
//
// Thread safety: a value type, as remote_descriptor.
struct remote_bundle {
  static constexpr std::uint16_t format_version = 2;
  // The most tensors one bundle holds (publish_bundle and decode refuse more).
  static constexpr std::uint32_t max_members = 4096;
  // The longest remote key a bundle carries (publish_bundle and decode
  // refuse longer ones: each member gets a copy of its key, so this bounds
  // what a bundle's bytes can make decode allocate, to 4 MiB).
  static constexpr std::uint32_t max_key_bytes = 1024;
  // In the encoding: a member that names no key.
  static constexpr std::uint32_t no_key = 0xffffffff;

  struct member {
    // The member's place among the tensors published under the lease.
    std::uint32_t index = 0;
    // Its description; lease_id, exporter_address and exporter_port are the
    // bundle's (decode sets them, the import refuses others); rkey is the
    // key of the registration that covers it, from an exporter that trusts
    // its peers, else empty.
    remote_descriptor descriptor;
  };

  std::uint64_t lease_id = 0;
  std::string exporter_address;
  std::uint16_t exporter_port = 0;
  // How many tensors the exporter published under the lease.
  std::uint32_t published = 0;
  // In rising order of index, at least one.
  std::vector<member> members;

  std::string encode() const;
  // InvalidArgument for malformed bytes (as remote_descriptor::decode, and
  // no members, indices that do not rise or lie past `published`, naming
  // the member, a key named by no member or a member naming no key);
  // OutOfRange above max_members, max_ndim or max_key_bytes.
  static absl::StatusOr<remote_bundle> decode(std::string_view bytes);
  // The bundle of the members at `positions` of this one (positions into
  // `members`, not indices): OutOfRange for a position past the end,
  // InvalidArgument for none or a repeat.
  absl::StatusOr<remote_bundle> select(const std::vector<std::size_t>& positions) const;
};

// How an importer moves the bytes (see docs/remote.md).
enum class remote_fetch : std::uint8_t {
  // The exporter sends the bytes (active messages, UCX's rendezvous for
  // large ones), except between trusted peers (trusted_peers on both
  // nodes, descriptors with remote keys) over an endpoint where UCX has a
  // native RMA lane (cma over shared memory), for an import of at least
  // remote_node_options::min_rma_bytes, where RMA gets read them.
  automatic,
  // Always RMA gets (UCX emulates them where a transport has no lane):
  // requires trusted_peers, and descriptors from exporters that trust their
  // peers too.
  rma,
  // Always the exporter sends the bytes.
  active_messages,
};

struct remote_node_options {
  // UCX transports (UCX_TLS's syntax: "shm", "tcp", "sm,tcp"); empty keeps
  // UCX's choice (and the UCX_TLS environment variable). A shared-memory
  // list gets tcp for UCX's connection manager (ucx_worker::create).
  std::string transports;
  // Where this node listens for importers' connections: a numeric IPv4 or
  // IPv6 address of this host that the importers reach (127.0.0.1 serves
  // this host's processes only), or a wildcard with advertised_address, and
  // a port (0: a free one). Descriptors name this address (or
  // advertised_address) and port. Empty: no listener; the node imports but
  // cannot publish.
  std::string listen_address = "127.0.0.1";
  std::uint16_t listen_port = 0;
  // The address descriptors name, where it is not listen_address: needed
  // when the node listens on every interface (listen_address "0.0.0.0" or
  // "::", which names no host), and for a host that importers reach at
  // another address (a NAT, a container's published address). Descriptors
  // name listen_port with it, so a forwarded port must be the same one. A
  // numeric IPv4 or IPv6 address, not a wildcard. Empty: listen_address.
  std::string advertised_address;
  // The most importers connected to the listener at once; more are
  // refused until one goes. At least 1.
  std::uint32_t max_connections = 1024;
  // Whether this node trusts its peers with its whole memory. Then its UCX
  // context has RMA, its publications are registered and their descriptors
  // carry a remote key, and its imports may read by RMA get. UCX's RMA lets
  // every connected peer read and write any memory of the process (its
  // software RMA over active messages checks no registration), so leave it
  // off unless every process that can reach the node is trusted.
  bool trusted_peers = false;
  // How long a whole import may take: past it, DeadlineExceeded, or Unavailable
  // if nothing came from its exporter since (the connection is then dropped).
  std::chrono::milliseconds import_timeout{std::chrono::seconds(60)};
  // How imports from this node move the bytes.
  remote_fetch fetch = remote_fetch::automatic;
  // A strided tensor's contiguous runs are sent (as this node exports) or
  // read (RMA, as it imports) one by one, straight into the compact result,
  // when they are at least this long and there are at most 65,536 of them.
  // Otherwise an exporter sends a compact copy it makes (or the span, when
  // the span holds each element once), and an RMA import reads the span
  // and compacts it. 0 chooses as measured (docs/remote.md): sent runs of
  // 16 to 64 KiB over shared memory and from 256 KiB over a network (by the
  // importer's connection), RMA gets from 4 KiB.
  std::uint64_t min_run_bytes = 0;
  // Under remote_fetch::automatic, the fewest bytes (one tensor's, or a
  // bundle's members' together) read by RMA between trusted peers; smaller
  // imports take the exporter's pieces. 0 chooses as measured
  // (docs/remote.md): 16 MiB.
  std::uint64_t min_rma_bytes = 0;
};

// Remote imports this node completed, by how their bytes came
// (remote_node::imports_completed). A bundle counts once.
struct remote_import_counts {
  std::uint64_t read_by_rma = 0;       // RMA gets this node issued
  std::uint64_t sent_by_exporter = 0;  // with the exporter's grant, or in its pieces
  // No bytes to move (size-0 tensors, or a bundle of them): neither way,
  // whichever the fetch was.
  std::uint64_t without_bytes = 0;
};

// Why a publication ended (remote_node::when_ended): from then on its
// holds are refused with NotFound.
enum class publication_end {
  released,  // every importer released its hold, or went away holding it
  expired,   // its lease ended first
  shutdown,  // the node shut down first
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

namespace detail {
class remote_core;
}  // namespace detail

class remote_node {
 public:
  using executor_type = runtime::executor_type;

  // InvalidArgument for a bad option (fetch = rma without trusted_peers,
  // max_connections = 0, a listen address that is not numeric); Unavailable
  // when UCX cannot start or listen (its message names UCX's status);
  // FailedPrecondition when `rt` already has a node or is shutting down.
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
  // Unavailable after shutdown; FailedPrecondition when the node does not
  // listen; Internal when UCX refuses the registration (trusted peers).
  // Between trusted peers the tensor is read by RMA under the key of a
  // registration: the remote_registration that covers its region, else
  // one made for it and let go when the publication ends.
  absl::StatusOr<remote_descriptor> publish(managed_tensor& source,
                                            const publish_options& options = {});
  absl::StatusOr<remote_descriptor> publish(const tensor& source,
                                            const publish_options& options = {});
  // Publishes `sources` (at least one, at most remote_bundle::max_members)
  // together under one lease, each validated as publish validates one; any
  // refusal refuses them all, naming the member, and consumes none. On
  // success every managed tensor is consumed (the handles are left empty);
  // each producer's deleter runs once when the lease ends, as for one
  // tensor. Between trusted peers each member is read by RMA under the key
  // of a registration: the remote_registration that covers it, else one
  // made for the publication, once for members whose memory overlaps or
  // touches (OutOfRange, naming the member, when UCX packs a key longer
  // than remote_bundle::max_key_bytes).
  absl::StatusOr<remote_bundle> publish_bundle(std::span<managed_tensor> sources,
                                               const publish_options& options = {});
  absl::StatusOr<remote_bundle> publish_bundle(std::span<const tensor> sources,
                                               const publish_options& options = {});

  // Calls `callback` once when the publication under `lease_id` (a
  // descriptor's or a bundle's) ends, saying why: its importers released
  // it, its lease ended, or the node shut down. It runs on the runtime's
  // executor, never under the node's lock, or on the thread that shuts the
  // node down; it should not block (an exception it throws is dropped). The
  // producer may still be held then, while sends of its bytes finish.
  // NotFound when this node has no publication under the lease that has not
  // ended (the callback is then never called: the end has passed);
  // InvalidArgument for an empty callback. remote_directory::
  // put_while_published withdraws a name with it.
  absl::Status when_ended(std::uint64_t lease_id, std::function<void(publication_end)> callback);

  // Registers [address, address + bytes) for RMA until the handle lets it
  // go (remote_registration). FailedPrecondition unless the node trusts its
  // peers (remote_node_options::trusted_peers: nothing is registered
  // without RMA); InvalidArgument for a null address, 0 bytes or a region
  // past the address space's end; AlreadyExists when it overlaps another
  // remote_registration of this node (it names that one's region);
  // Unavailable after shutdown; Internal (or ResourceExhausted) when UCX
  // refuses.
  absl::StatusOr<remote_registration> register_memory(const void* address, std::size_t bytes);

  // Publications whose producer has not been released yet.
  std::size_t publications() const;
  // Memory registrations held now (remote_registrations and publications'
  // own), and UCX registrations made since the node was created:
  // re-publishing registered memory adds none.
  std::size_t registrations() const;
  std::uint64_t registrations_made() const;
  // Remote imports in flight, and those completed (with their tensors) so
  // far, by how their bytes came: which fetch `automatic` chose.
  std::size_t imports_in_flight() const;
  remote_import_counts imports_completed() const;
  // Importers connected to this node's listener.
  std::size_t connections() const;
  // Where this node listens: its address and port (descriptors name the
  // port, with advertised_address); empty and 0 without a listener.
  std::string listen_address() const;
  // The address its descriptors name (advertised_address, or
  // listen_address); empty without a listener.
  std::string advertised_address() const;
  std::uint16_t listen_port() const;
  // The transports UCX chose for this node's worker, as UCX names them.
  std::string transports() const;

  // Stops: imports in flight fail with Cancelled, every publication is
  // released (its producer's deleter runs), endpoints are closed and UCX is
  // finalised. Idempotent: a second caller returns once the first is done
  // (one from a deleter or an end callback returns at once); must not be
  // called from the runtime's threads.
  void shutdown();

 private:
  // The initiating functions' one way in: the import's operation (node.cpp).
  friend std::shared_ptr<detail::remote_import> detail::make_remote_import(remote_node& node);

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
// when the exporter cannot be reached, goes away or is silent past
// import_timeout, DeadlineExceeded when the import outlasts it or the
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
      detail::initiate_remote_import{&node, &node.get_runtime()}, token, descriptor, options);
}

// Fetches the members of `bundle` from their exporter with one hold, every
// member's bytes in flight together, and one release, and lands each on
// `options.target`: completion signature
// void(absl::StatusOr<std::vector<dlasync::tensor>>), the tensors in the
// order of bundle.members. Every member is validated before anything moves,
// as async_import_remote validates one descriptor; a refusal of any member
// (here, or by the exporter) refuses the whole import, and its message
// names the member. Failures in flight, cancellation and timeouts end the
// whole import, as for one tensor. Between trusted peers the members are
// read by RMA when every one with bytes carries a key (and, under
// remote_fetch::automatic, they come to at least min_rma_bytes); under
// remote_fetch::rma a member without a key refuses the import
// (FailedPrecondition, rule "remote_region", naming the member).
template <ASIO_COMPLETION_TOKEN_FOR(void(absl::StatusOr<std::vector<tensor>>))
              CompletionToken = dlasync::detail::default_token_t<runtime::executor_type>>
auto async_import_remote_bundle(remote_node& node, const remote_bundle& bundle,
                                const remote_import_options& options = {},
                                CompletionToken&& token = CompletionToken()) {
  return asio::async_initiate<CompletionToken, void(absl::StatusOr<std::vector<tensor>>)>(
      detail::initiate_remote_import{&node, &node.get_runtime()}, token, bundle, options);
}

#if defined(ASIO_HAS_CO_AWAIT)
// The same, awaited: validation happens when it is awaited.
[[nodiscard]] asio::awaitable<absl::StatusOr<tensor>> import_remote(
    remote_node& node, remote_descriptor descriptor, remote_import_options options = {});
[[nodiscard]] asio::awaitable<absl::StatusOr<std::vector<tensor>>> import_remote_bundle(
    remote_node& node, remote_bundle bundle, remote_import_options options = {});
#endif

}  // namespace dlasync
