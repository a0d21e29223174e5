#include "dlasync/remote.hpp"

#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "asio/use_awaitable.hpp"
#include "dlasync/import.hpp"
#include "dlasync/producer.hpp"
#include "remote/src/numeric_address.hpp"
#include "remote/src/plan_remote.hpp"
#include "remote/src/remote_core.hpp"
#include "remote/src/remote_import.hpp"

namespace dlasync {
namespace {

// The runtimes that have a node: one each. Never destroyed, so that a node
// that goes while statics are destroyed at exit still finds them.
std::mutex& nodes_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::set<const runtime*>& nodes() {
  static auto* s = new std::set<const runtime*>;
  return *s;
}

absl::Status check(const publish_options& o) {
  if (o.importers == 0) {
    return absl::InvalidArgumentError(
        "publish_options::importers = 0: a publication needs at least one importer");
  }
  if (o.lease.count() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("publish_options::lease = ", o.lease.count(),
                                                   " ms: a lease must last longer than 0 ms"));
  }
  return absl::OkStatus();
}

// What a descriptor says of `source`, which plan_import accepted as `plan`.
remote_descriptor describe(const managed_tensor& source, const import_plan& plan) {
  const DLTensor& dl = *source.dl_tensor();
  remote_descriptor d;
  d.dlpack_major = dlpack_major_version;
  d.dlpack_minor = source.is_versioned() ? source.version().minor : 0;
  d.source_device = plan.source;
  d.type = plan.type;
  d.shape.assign(dl.shape, dl.shape + dl.ndim);
  d.strides.resize(static_cast<std::size_t>(dl.ndim));
  if (dl.strides != nullptr) {
    d.strides.assign(dl.strides, dl.strides + dl.ndim);
  } else {
    std::int64_t stride = 1;
    for (std::int32_t i = dl.ndim; i-- > 0;) {
      d.strides[static_cast<std::size_t>(i)] = stride;
      stride *= std::max<std::int64_t>(dl.shape[i], 1);
    }
  }
  d.byte_offset = dl.byte_offset;
  d.flags = plan.flags;
  d.data = reinterpret_cast<std::uintptr_t>(dl.data);
  if (plan.element_count > 0) {
    d.region_begin = plan.address + static_cast<std::uint64_t>(plan.span_begin);
    d.region_bytes = static_cast<std::uint64_t>(plan.span_end - plan.span_begin);
  }
  return d;
}

absl::StatusOr<remote_descriptor> plan_publication(runtime& rt, const managed_tensor& source) {
  absl::StatusOr<import_plan> plan = plan_import(source, import_options{}, rt.registry());
  if (!plan.ok()) return plan.status();
  if (!is_host_memory(plan->source.kind)) {
    return absl::UnimplementedError(absl::StrCat(
        "the tensor lives on ", plan->source.name(),
        "; this UCX cannot register GPU memory (it has no CUDA transports): import it onto "
        "cpu:0 and publish that"));
  }
  return describe(source, *plan);
}

// What a descriptor says of an imported tensor: a view keeps its producer
// alive, a copy its memory.
absl::StatusOr<remote_descriptor> describe_imported(runtime& rt, const tensor& source) {
  if (source.empty()) return absl::InvalidArgumentError("publish: the tensor is empty");
  tensor_description desc;
  desc.data = source.dl_data();
  desc.device = source.device();
  desc.dtype = source.dtype();
  desc.shape.assign(source.shape().begin(), source.shape().end());
  desc.strides = std::vector<std::int64_t>(source.strides().begin(), source.strides().end());
  desc.byte_offset = source.byte_offset();
  desc.flags = source.flags();
  // A description of the tensor's memory that owns nothing.
  managed_tensor stand_in = make_managed_tensor(std::move(desc));
  return plan_publication(rt, stand_in);
}

absl::Status check(const publish_options& o, std::size_t members) {
  if (members == 0) {
    return absl::InvalidArgumentError("publish_bundle: no tensors; a bundle holds at least one");
  }
  if (members > remote_bundle::max_members) {
    return absl::OutOfRangeError(absl::StrCat("publish_bundle: ", members,
                                              " tensors; a bundle holds at most ",
                                              remote_bundle::max_members, ": publish several"));
  }
  return check(o);
}

remote_bundle bundle_of(std::vector<remote_descriptor> published) {
  remote_bundle b;
  b.lease_id = published.front().lease_id;
  b.exporter_address = published.front().exporter_address;
  b.exporter_port = published.front().exporter_port;
  b.published = static_cast<std::uint32_t>(published.size());
  b.members.resize(published.size());
  for (std::size_t i = 0; i < published.size(); ++i) {
    b.members[i].index = static_cast<std::uint32_t>(i);
    b.members[i].descriptor = std::move(published[i]);
  }
  return b;
}

// Descriptors must name an address an importer can connect to.
absl::Status check_addresses(const remote_node_options& o) {
  if (o.listen_address.empty()) {
    if (o.advertised_address.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "remote_node_options::advertised_address = \"", o.advertised_address,
        "\", but listen_address is empty: the node does not listen, so nothing is advertised"));
  }
  if (o.advertised_address.empty()) {
    if (!remote_detail::is_wildcard_address(o.listen_address)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "remote_node_options::listen_address = \"", o.listen_address,
        "\" listens on every interface, but a descriptor names one address: set "
        "remote_node_options::advertised_address to the address importers reach this host at"));
  }
  if (!remote_detail::is_numeric_address(o.advertised_address) ||
      remote_detail::is_wildcard_address(o.advertised_address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "remote_node_options::advertised_address = \"", o.advertised_address,
        "\": descriptors need a numeric IPv4 or IPv6 address that names a host, not a name "
        "or a wildcard"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<remote_node>> remote_node::create(runtime& rt,
                                                                 remote_node_options options) {
  if (options.import_timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote_node_options::import_timeout = ", options.import_timeout.count(),
                     " ms: it must be above 0"));
  }
  if (options.fetch == remote_fetch::rma && !options.trusted_peers) {
    return absl::InvalidArgumentError(
        "remote_node_options::fetch = rma needs trusted_peers: RMA lets peers read and write "
        "this process's memory; use remote_fetch::automatic, or trust the peers");
  }
  if (absl::Status s = check_addresses(options); !s.ok()) return s;
  if (options.max_connections == 0) {
    return absl::InvalidArgumentError(
        "remote_node_options::max_connections = 0: the listener would refuse every importer; "
        "allow at least 1");
  }
  if (!rt.accepting()) {
    return absl::FailedPreconditionError("the runtime is shutting down; create the node before");
  }
  {
    std::lock_guard lock(nodes_mutex());
    if (!nodes().insert(&rt).second) {
      return absl::FailedPreconditionError(
          "this runtime has a remote node already; a runtime has one UCX worker: share its node");
    }
  }
  auto worker = ucx_worker::create(rt.get_executor(), options.transports,
                                   ucx_worker::features{.rma = options.trusted_peers});
  if (!worker.ok()) {
    std::lock_guard lock(nodes_mutex());
    nodes().erase(&rt);
    return worker.status();
  }
  auto core = std::make_shared<detail::remote_core>(rt, std::move(options), *std::move(worker));
  if (absl::Status s = core->start(); !s.ok()) {
    core->shutdown();
    std::lock_guard lock(nodes_mutex());
    nodes().erase(&rt);
    return s;
  }
  return std::unique_ptr<remote_node>(new remote_node(std::move(core)));
}

remote_node::remote_node(std::shared_ptr<detail::remote_core> core) noexcept
    : core_(std::move(core)) {}

std::shared_ptr<detail::remote_import> detail::make_remote_import(remote_node& node) {
  return make_remote_import(*node.core_);
}

remote_node::~remote_node() {
  shutdown();
  std::lock_guard lock(nodes_mutex());
  nodes().erase(&core_->rt());
}

runtime& remote_node::get_runtime() noexcept {
  return core_->rt();
}
remote_node::executor_type remote_node::get_executor() noexcept {
  return core_->executor();
}

absl::StatusOr<remote_descriptor> remote_node::publish(managed_tensor& source,
                                                       const publish_options& options) {
  if (absl::Status s = check(options); !s.ok()) return s;
  absl::StatusOr<remote_descriptor> d = plan_publication(core_->rt(), source);
  if (!d.ok()) return d.status();
  std::vector<detail::published_member> members(1);
  members[0].description = *std::move(d);
  members[0].holder = std::move(source);
  absl::StatusOr<std::vector<remote_descriptor>> out =
      core_->publish(members, /*bundle=*/false, options);
  if (!out.ok()) {
    source = std::get<managed_tensor>(std::move(members[0].holder));  // still the caller's
    return out.status();
  }
  return std::move(out->front());
}

absl::StatusOr<remote_descriptor> remote_node::publish(const tensor& source,
                                                       const publish_options& options) {
  if (absl::Status s = check(options); !s.ok()) return s;
  absl::StatusOr<remote_descriptor> d = describe_imported(core_->rt(), source);
  if (!d.ok()) return d.status();
  std::vector<detail::published_member> members(1);
  members[0].description = *std::move(d);
  members[0].holder = source;
  absl::StatusOr<std::vector<remote_descriptor>> out =
      core_->publish(members, /*bundle=*/false, options);
  if (!out.ok()) return out.status();
  return std::move(out->front());
}

absl::StatusOr<remote_bundle> remote_node::publish_bundle(std::span<managed_tensor> sources,
                                                          const publish_options& options) {
  if (absl::Status s = check(options, sources.size()); !s.ok()) return s;
  std::vector<detail::published_member> members(sources.size());
  for (std::size_t i = 0; i < sources.size(); ++i) {
    absl::StatusOr<remote_descriptor> d = plan_publication(core_->rt(), sources[i]);
    if (!d.ok()) return remote_detail::for_member(d.status(), i, sources.size());
    members[i].description = *std::move(d);
  }
  for (std::size_t i = 0; i < sources.size(); ++i) members[i].holder = std::move(sources[i]);
  absl::StatusOr<std::vector<remote_descriptor>> out =
      core_->publish(members, /*bundle=*/true, options);
  if (!out.ok()) {
    // Every member is still the caller's.
    for (std::size_t i = 0; i < sources.size(); ++i) {
      sources[i] = std::get<managed_tensor>(std::move(members[i].holder));
    }
    return out.status();
  }
  return bundle_of(*std::move(out));
}

absl::StatusOr<remote_bundle> remote_node::publish_bundle(std::span<const tensor> sources,
                                                          const publish_options& options) {
  if (absl::Status s = check(options, sources.size()); !s.ok()) return s;
  std::vector<detail::published_member> members(sources.size());
  for (std::size_t i = 0; i < sources.size(); ++i) {
    absl::StatusOr<remote_descriptor> d = describe_imported(core_->rt(), sources[i]);
    if (!d.ok()) return remote_detail::for_member(d.status(), i, sources.size());
    members[i].description = *std::move(d);
    members[i].holder = sources[i];
  }
  absl::StatusOr<std::vector<remote_descriptor>> out =
      core_->publish(members, /*bundle=*/true, options);
  if (!out.ok()) return out.status();
  return bundle_of(*std::move(out));
}

absl::Status remote_node::when_ended(std::uint64_t lease_id,
                                     std::function<void(publication_end)> callback) {
  return core_->when_ended(lease_id, std::move(callback));
}

absl::StatusOr<remote_registration> remote_node::register_memory(const void* address,
                                                                 std::size_t bytes) {
  const auto begin = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(address));
  absl::StatusOr<std::uint64_t> id = core_->register_memory(begin, bytes);
  if (!id.ok()) return id.status();
  return remote_registration(core_, *id, begin, bytes);
}

std::size_t remote_node::publications() const {
  return core_->publications();
}
std::size_t remote_node::registrations() const {
  return core_->registrations();
}
std::uint64_t remote_node::registrations_made() const {
  return core_->registrations_made();
}
std::size_t remote_node::imports_in_flight() const {
  return core_->imports_in_flight();
}
remote_import_counts remote_node::imports_completed() const {
  return core_->imports_completed();
}
std::size_t remote_node::connections() const {
  return core_->connections();
}
std::string remote_node::listen_address() const {
  return core_->listen_address();
}
std::string remote_node::advertised_address() const {
  return core_->advertised_address();
}
std::uint16_t remote_node::listen_port() const {
  return core_->listen_port();
}
std::string remote_node::transports() const {
  return core_->ucx().transports();
}
void remote_node::shutdown() {
  core_->shutdown();
}

remote_registration::remote_registration(std::weak_ptr<detail::remote_core> core, std::uint64_t id,
                                         std::uint64_t address, std::uint64_t bytes) noexcept
    : core_(std::move(core)), id_(id), address_(address), bytes_(bytes) {}

remote_registration::remote_registration(remote_registration&& other) noexcept
    : core_(std::move(other.core_)),
      id_(std::exchange(other.id_, 0)),
      address_(std::exchange(other.address_, 0)),
      bytes_(std::exchange(other.bytes_, 0)) {}

remote_registration& remote_registration::operator=(remote_registration&& other) noexcept {
  if (this != &other) {
    reset();
    core_ = std::move(other.core_);
    id_ = std::exchange(other.id_, 0);
    address_ = std::exchange(other.address_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

remote_registration::~remote_registration() {
  reset();
}

void remote_registration::reset() noexcept {
  if (id_ != 0) {
    if (std::shared_ptr<detail::remote_core> core = core_.lock()) core->unregister_memory(id_);
  }
  core_.reset();
  id_ = 0;
  address_ = 0;
  bytes_ = 0;
}

#if defined(ASIO_HAS_CO_AWAIT)
asio::awaitable<absl::StatusOr<tensor>> import_remote(remote_node& node,
                                                      remote_descriptor descriptor,
                                                      remote_import_options options) {
  co_return co_await async_import_remote(node, descriptor, options, asio::use_awaitable);
}

asio::awaitable<absl::StatusOr<std::vector<tensor>>> import_remote_bundle(
    remote_node& node, remote_bundle bundle, remote_import_options options) {
  co_return co_await async_import_remote_bundle(node, bundle, options, asio::use_awaitable);
}
#endif

}  // namespace dlasync
