#include "remote_inputs.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "asio/ip/address.hpp"

namespace dlasync::examples::kserve {
namespace {

static_assert(remote_bundle_max_members == remote_bundle::max_members);

// Whether two numeric addresses name the same host (an IPv4 address and
// its IPv4-mapped IPv6 form alike).
bool same_host(const std::string& a, const std::string& b) {
  asio::error_code ea;
  asio::error_code eb;
  asio::ip::address x = asio::ip::make_address(a, ea);
  asio::ip::address y = asio::ip::make_address(b, eb);
  if (ea || eb) return false;
  const auto v4 = [](asio::ip::address& addr) {
    if (addr.is_v6() && addr.to_v6().is_v4_mapped()) {
      addr = asio::ip::make_address_v4(asio::ip::v4_mapped, addr.to_v6());
    }
  };
  v4(x);
  v4(y);
  return x == y;
}

std::string described(dtype type, const std::vector<std::int64_t>& shape) {
  const std::optional<absl::string_view> name = datatype_of(type);
  return absl::StrCat(name ? *name : absl::string_view("a datatype the protocol does not name"),
                      " [", absl::StrJoin(shape, ","), "]");
}

}  // namespace

absl::StatusOr<std::unique_ptr<remote_inputs>> remote_inputs::create(runtime& rt,
                                                                     const options& o) {
  remote_node_options no;
  no.transports = o.transports;
  no.listen_address.clear();  // it imports only
  no.import_timeout = o.timeout;
  if (o.min_port == 0 || o.min_port > o.max_port) {
    return absl::InvalidArgumentError(absl::StrCat("exporter ports ", o.min_port, "-", o.max_port,
                                                   ": give a range of ports from 1 up"));
  }
  absl::StatusOr<std::unique_ptr<remote_node>> node = remote_node::create(rt, no);
  if (!node.ok()) return node.status();
  return std::unique_ptr<remote_inputs>(new remote_inputs(*std::move(node), o));
}

remote_inputs::~remote_inputs() {
  shutdown();
}

void remote_inputs::shutdown() {
  if (node_ != nullptr) node_->shutdown();
}

asio::awaitable<absl::Status> remote_inputs::fetch(infer_request& r, std::string peer) {
  absl::StatusOr<remote_bundle> bundle = remote_bundle::decode(r.bundle);
  if (!bundle.ok()) {
    co_return absl::Status(bundle.status().code(), absl::StrCat("the request's dlasync_bundle: ",
                                                                bundle.status().message()));
  }
  if (!same_host(bundle->exporter_address, peer)) {
    co_return absl::PermissionDeniedError(absl::StrCat(
        "the request's dlasync_bundle names an exporter at ", clip(bundle->exporter_address),
        ", not the host the request came from (", peer.empty() ? "unknown" : peer,
        "): this server fetches a bundle only from the peer that sends the request"));
  }
  if (bundle->exporter_port < min_port_ || bundle->exporter_port > max_port_) {
    co_return absl::PermissionDeniedError(absl::StrCat(
        "the request's dlasync_bundle names an exporter at port ", bundle->exporter_port,
        " of its host, outside the ports this server fetches from (", min_port_, "-", max_port_,
        ", --remote_input_ports): publish on a port in that range"));
  }
  // Each member at most once, and as its input says, before anything moves.
  const std::size_t count = bundle->members.size();
  std::vector<input_tensor*> by_position(count, nullptr);
  for (input_tensor& in : r.inputs) {
    if (!in.bundle_member) continue;
    const std::size_t position = *in.bundle_member;
    const std::string label = absl::StrCat("input ", clip(in.name));
    if (position >= count) {
      co_return absl::OutOfRangeError(absl::StrCat(label, " names member ", position,
                                                   " of the request's bundle, which has ", count));
    }
    if (by_position[position] != nullptr) {
      co_return absl::InvalidArgumentError(
          absl::StrCat(label, " names member ", position, " of the request's bundle, which input ",
                       clip(by_position[position]->name), " names too"));
    }
    const remote_descriptor& d = bundle->members[position].descriptor;
    if (d.type != in.type || d.shape != in.shape) {
      co_return absl::InvalidArgumentError(
          absl::StrCat(label, " is ", described(in.type, in.shape), "; member ", position,
                       " of the request's bundle is ", described(d.type, d.shape)));
    }
    by_position[position] = &in;
  }
  std::vector<std::size_t> positions;
  for (std::size_t p = 0; p < count; ++p) {
    if (by_position[p] != nullptr) positions.push_back(p);
  }
  absl::StatusOr<remote_bundle> chosen = bundle->select(positions);
  if (!chosen.ok()) co_return chosen.status();
  // One hold for the members named, their bytes in flight together.
  absl::StatusOr<std::vector<tensor>> fetched =
      co_await import_remote_bundle(*node_, *std::move(chosen));
  if (!fetched.ok()) {
    co_return absl::Status(fetched.status().code(),
                           absl::StrCat("the request's bundle (lease ", bundle->lease_id, " at ",
                                        clip(bundle->exporter_address), ":", bundle->exporter_port,
                                        "): ", fetched.status().message()));
  }
  for (std::size_t i = 0; i < positions.size(); ++i) {
    input_tensor& in = *by_position[positions[i]];
    auto t = std::make_shared<tensor>(std::move((*fetched)[i]));
    in.data = static_cast<std::byte*>(t->data());
    in.read_only = t->read_only();
    in.owner = std::move(t);
  }
  co_return absl::OkStatus();
}

}  // namespace dlasync::examples::kserve
