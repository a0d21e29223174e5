// The remote tests' fixtures: importing nodes, the peer process, nodes in
// this process that publish the test's own tensors, and the checks on what
// arrives.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "asio/bind_cancellation_slot.hpp"
#include "asio/bind_executor.hpp"
#include "asio/cancellation_signal.hpp"
#include "asio/executor_work_guard.hpp"
#include "asio/io_context.hpp"
#include "asio/post.hpp"
#include "asio/strand.hpp"
#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "dlasync/remote.hpp"
#include "remote/remote_support.hpp"
#include "support/copy_budget.hpp"
#include "support/runtime_fixture.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {

using namespace std::chrono_literals;
using testing::peer_process;

struct importer {
  std::unique_ptr<runtime> rt;
  std::unique_ptr<remote_node> node;
  ~importer() {
    if (node) node->shutdown();
    node.reset();
    rt.reset();
  }
};

// A node with options `o` on a runtime of its own, with a copy budget of
// `budget` (0: the default).
// A TCP socket bound to a free port of loopback, listening with `backlog`
// (none when 0): its descriptor, which the caller closes, and its port.
inline std::pair<int, std::uint16_t> loopback_socket(int backlog) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(a);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  if (backlog > 0) REQUIRE(listen(fd, backlog) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length) == 0);
  return {fd, ntohs(a.sin_port)};
}

inline std::unique_ptr<importer> make_importer(const remote_node_options& o,
                                               std::uint64_t budget = 0) {
  auto i = std::make_unique<importer>();
  i->rt = testing::make_runtime(2, budget);
  auto node = remote_node::create(*i->rt, o);
  INFO(node.status().ToString());
  REQUIRE(node.ok());
  i->node = *std::move(node);
  return i;
}

inline std::unique_ptr<importer> make_importer(const std::string& transports,
                                               std::uint64_t budget = 0, bool trusted = false,
                                               std::chrono::milliseconds import_timeout = 30s) {
  remote_node_options o;
  o.transports = transports;
  o.trusted_peers = trusted;
  o.import_timeout = import_timeout;
  return make_importer(o, budget);
}

inline std::unique_ptr<peer_process> start_peer(const std::string& transports,
                                                bool trusted = false) {
  std::vector<std::string> args{"--transports=" + transports};
  if (trusted) args.emplace_back("--trusted");
  auto p = std::make_unique<peer_process>(DLASYNC_REMOTE_PEER, std::move(args));
  REQUIRE(p->running());
  std::optional<std::string> ready = p->read_line();
  REQUIRE(ready);
  REQUIRE(*ready == "ready");
  return p;
}

inline std::string dtype_arg(const dtype& t) {
  return std::to_string(t.code) + ":" + std::to_string(t.bits) + ":" + std::to_string(t.lanes);
}

inline remote_descriptor descriptor_from(const std::optional<std::string>& line) {
  REQUIRE(line);
  INFO(*line);
  REQUIRE(line->rfind("descriptor ", 0) == 0);
  absl::StatusOr<remote_descriptor> d =
      remote_descriptor::decode(testing::from_hex(line->substr(11)));
  REQUIRE(d.ok());
  return *d;
}

inline absl::StatusOr<tensor> import_now(remote_node& node, const remote_descriptor& d,
                                         const import_options& o = {}) {
  std::future<absl::StatusOr<tensor>> f = async_import_remote(node, d, o, asio::use_future);
  REQUIRE(f.wait_for(60s) == std::future_status::ready);
  return f.get();
}

inline int peer_count(peer_process& p, const std::string& what) {
  std::optional<std::string> line = p.ask(what);
  REQUIRE(line);
  REQUIRE(line->rfind(what + " ", 0) == 0);
  return std::stoi(line->substr(what.size() + 1));
}

inline bool peer_reaches(peer_process& p, const std::string& what, int value) {
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < until) {
    if (peer_count(p, what) == value) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

inline void check_bytes(const tensor& t, const std::string& layout,
                        const std::vector<std::int64_t>& shape, const dtype& type, unsigned seed) {
  REQUIRE(t.is_copy());
  REQUIRE(t.is_compact());
  REQUIRE(std::vector<std::int64_t>(t.shape().begin(), t.shape().end()) == shape);
  REQUIRE(t.dtype() == type);
  const std::optional<std::uint64_t> bad =
      testing::first_mismatch(static_cast<const unsigned char*>(t.data()), t.byte_size(), layout,
                              shape, type.padded_size(), seed);
  INFO("first wrong byte: " << (bad ? std::to_string(*bad) : "none"));
  REQUIRE_FALSE(bad.has_value());
}

// Two nodes in this process, each on its own runtime: one exports, the
// other imports (UCX connects them as it would two processes).
struct node_pair {
  std::unique_ptr<importer> exporter = make_importer("");
  std::unique_ptr<importer> importer_ = make_importer("");
  remote_node& out() { return *exporter->node; }
  remote_node& in() { return *importer_->node; }
};

// A host tensor of the pattern owned by the test, published with a
// counting deleter.
struct published_tensor {
  std::shared_ptr<testing::laid_out> memory;
  testing::deleter_count count;
  remote_descriptor descriptor;
};

inline std::unique_ptr<published_tensor> publish_here(remote_node& node, const std::string& layout,
                                                      std::vector<std::int64_t> shape,
                                                      const publish_options& o = {},
                                                      unsigned seed = 1,
                                                      dtype type = dtypes::float32) {
  auto p = std::make_unique<published_tensor>();
  p->memory = std::make_shared<testing::laid_out>(
      testing::lay_out(layout, std::move(shape), type.padded_size(), seed));
  testing::tensor_spec spec;
  spec.type = type;
  spec.shape = p->memory->shape;
  spec.strides = p->memory->strides;
  spec.data = p->memory->data();
  spec.byte_offset = p->memory->byte_offset;
  managed_tensor t = testing::make_tensor(spec, p->count);
  absl::StatusOr<remote_descriptor> d = node.publish(t, o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  REQUIRE(t.empty());  // consumed
  p->descriptor = *d;
  return p;
}

// A refusal with `code`, `words` in its message and the import_error's
// `rule`; of one tensor or of a bundle.
template <typename Result>
void require_refused(const absl::StatusOr<Result>& t, absl::StatusCode code,
                     const std::string& rule, const std::string& words) {
  INFO(t.status().ToString());
  REQUIRE_FALSE(t.ok());
  REQUIRE(t.status().code() == code);
  REQUIRE_THAT(std::string(t.status().message()), Catch::Contains(words));
  std::optional<import_error> why = import_error_of(t.status());
  REQUIRE(why);
  REQUIRE(why->rule == rule);
}

// Cancels imports at chosen moments. Asio's rule: a cancellation signal is
// emitted on the handler's executor, never beside the handler's own
// completion (which clears the slot). The handler runs on a strand, and the
// emit is posted to it.
class canceller {
 public:
  canceller() : work_(asio::make_work_guard(io_)), strand_(asio::make_strand(io_)) {
    thread_ = std::thread([this] { io_.run(); });
  }
  ~canceller() {
    work_.reset();
    thread_.join();
  }
  // `start(token)` starts an import with the completion token it is given;
  // the import is cancelled (terminal) `delay` later, and its result
  // returned once the emit has run too.
  template <typename Result, typename Start>
  absl::StatusOr<Result> cancelled_after(std::chrono::microseconds delay, Start start) {
    asio::cancellation_signal signal;
    std::promise<absl::StatusOr<Result>> got;
    start(asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(strand_, [&got](auto r) {
                                         got.set_value(std::move(r));
                                       })));
    std::this_thread::sleep_for(delay);
    asio::post(strand_, [&signal] { signal.emit(asio::cancellation_type::terminal); });
    std::future<absl::StatusOr<Result>> f = got.get_future();
    REQUIRE(f.wait_for(30s) == std::future_status::ready);
    // The emit has run too before `signal` goes (the strand runs in order).
    std::promise<void> drained;
    asio::post(strand_, [&drained] { drained.set_value(); });
    drained.get_future().wait();
    return f.get();
  }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  asio::strand<asio::io_context::executor_type> strand_;
  std::thread thread_;
};

// Bundles.

// One member as remote_peer's publish_bundle takes it.
struct member_spec {
  std::string layout;
  std::vector<std::int64_t> shape;
};

// Every layout the tests know (wide rows large enough to go by rendezvous),
// a 0-d and a size-0 member, and a 2 MiB one.
inline std::vector<member_spec> every_layout_members() {
  std::vector<member_spec> members;
  for (const std::string& layout : testing::layouts()) {
    members.push_back({layout, layout == "wide_rows" ? std::vector<std::int64_t>{4, 8192}
                                                     : std::vector<std::int64_t>{6, 5, 3}});
  }
  members.push_back({"contiguous", {}});
  members.push_back({"contiguous", {4, 0, 3}});
  members.push_back({"contiguous", {512, 1024}});
  return members;
}

inline std::string members_arg(const std::vector<member_spec>& members) {
  std::string out;
  for (const member_spec& m : members) {
    out += (out.empty() ? "" : ",") + m.layout + ":" + testing::shape_text(m.shape);
  }
  return out;
}

inline remote_bundle bundle_from(const std::optional<std::string>& line) {
  REQUIRE(line);
  INFO(*line);
  REQUIRE(line->rfind("bundle ", 0) == 0);
  absl::StatusOr<remote_bundle> b = remote_bundle::decode(testing::from_hex(line->substr(7)));
  REQUIRE(b.ok());
  return *b;
}

// remote_peer's publish_bundle: float32 members laid out as `members`
// (member i with seed `seed + i`), for `importers`, under a 20 s lease.
inline remote_bundle publish_on_peer(peer_process& peer, const std::vector<member_spec>& members,
                                     unsigned seed, int importers = 1) {
  return bundle_from(peer.ask("publish_bundle " + dtype_arg(dtypes::float32) + " " +
                              members_arg(members) + " " + std::to_string(importers) + " 20000 " +
                              std::to_string(seed)));
}

inline absl::StatusOr<std::vector<tensor>> import_bundle_now(remote_node& node,
                                                             const remote_bundle& b,
                                                             const import_options& o = {}) {
  std::future<absl::StatusOr<std::vector<tensor>>> f =
      async_import_remote_bundle(node, b, o, asio::use_future);
  REQUIRE(f.wait_for(60s) == std::future_status::ready);
  return f.get();
}

// Each of `got` is the member publish_bundle laid out as `members` (member i
// with seed `seed + i`), a compact host copy; a 0-d or size-0 member has its
// shape.
inline void check_bundle(const std::vector<tensor>& got, const std::vector<member_spec>& members,
                         unsigned seed) {
  REQUIRE(got.size() == members.size());
  for (std::size_t i = 0; i < members.size(); ++i) {
    INFO("member " << i << ": " << members[i].layout << " "
                   << testing::shape_text(members[i].shape));
    const tensor& t = got[i];
    REQUIRE(t.device() == host_device);
    if (members[i].shape.empty() || t.byte_size() == 0) {
      REQUIRE(std::vector<std::int64_t>(t.shape().begin(), t.shape().end()) == members[i].shape);
      continue;
    }
    check_bytes(t, members[i].layout, members[i].shape, dtypes::float32,
                seed + static_cast<unsigned>(i));
  }
}

// After a bundle of `n` members from `peer` was imported into `got`: the
// peer has run all `n` deleters and holds no publication, and, once `got`
// is dropped, the importer's budget is all back.
inline void require_released(peer_process& peer, int n, importer& in,
                             absl::StatusOr<std::vector<tensor>>& got) {
  REQUIRE(peer_reaches(peer, "deleted", n));
  REQUIRE(peer_count(peer, "publications") == 0);
  got = absl::StatusOr<std::vector<tensor>>(std::vector<tensor>{});
  REQUIRE(testing::copy_budget(*in.rt).in_use() == 0);
}

// Tensors of the pattern owned by the test, published together with
// counting deleters.
struct published_bundle {
  std::vector<std::shared_ptr<testing::laid_out>> memory;
  testing::deleter_count count;
  remote_bundle bundle;
};

inline std::vector<managed_tensor> laid_out_tensors(published_bundle& p,
                                                    const std::vector<member_spec>& members,
                                                    unsigned seed) {
  std::vector<managed_tensor> sources;
  for (std::size_t i = 0; i < members.size(); ++i) {
    p.memory.push_back(std::make_shared<testing::laid_out>(
        testing::lay_out(members[i].layout, members[i].shape, 4, seed + static_cast<unsigned>(i))));
    testing::tensor_spec spec;
    spec.shape = p.memory.back()->shape;
    spec.strides = p.memory.back()->strides;
    spec.data = p.memory.back()->data();
    spec.byte_offset = p.memory.back()->byte_offset;
    sources.push_back(testing::make_tensor(spec, p.count));
  }
  return sources;
}

inline std::unique_ptr<published_bundle> publish_bundle_here(
    remote_node& node, const std::vector<member_spec>& members, const publish_options& o = {},
    unsigned seed = 1) {
  auto p = std::make_unique<published_bundle>();
  std::vector<managed_tensor> sources = laid_out_tensors(*p, members, seed);
  absl::StatusOr<remote_bundle> b = node.publish_bundle(sources, o);
  INFO(b.status().ToString());
  REQUIRE(b.ok());
  for (const managed_tensor& t : sources) REQUIRE(t.empty());  // consumed
  p->bundle = *b;
  return p;
}

}  // namespace dlasync
