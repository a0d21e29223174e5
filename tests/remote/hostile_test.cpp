// Remote imports against hostile peers: processes of their own
// (tests/remote/hostile_peer.cpp) that forge descriptors, releases, holds,
// answers and active messages, and stall. Each case is a finding of a
// review: what a peer could do, and what it cannot do any more.
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "dlasync/remote.hpp"
#include "remote/remote_fixture.hpp"
#include "remote/remote_support.hpp"
#include "remote/src/protocol.hpp"
#include "support/copy_budget.hpp"
#include "support/runtime_fixture.hpp"

namespace dlasync {
namespace {

std::unique_ptr<peer_process> start_hostile(const std::string& transports = "") {
  auto p = std::make_unique<peer_process>(DLASYNC_HOSTILE_PEER,
                                          std::vector<std::string>{"--transports=" + transports});
  REQUIRE(p->running());
  REQUIRE(p->read_line() == "ready");
  return p;
}

void connect(peer_process& hostile, const remote_descriptor& d) {
  REQUIRE(hostile.ask("connect " + d.exporter_address + " " + std::to_string(d.exporter_port)) ==
          "connected");
}

std::string hex(const remote_descriptor& d) {
  return testing::to_hex(d.encode());
}

// A tensor of `bytes` uint8 at a hostile exporter's listener.
remote_descriptor at_hostile_exporter(std::uint16_t port, std::uint64_t bytes) {
  remote_descriptor d;
  d.lease_id = 1;
  d.type = dtypes::uint8;
  d.shape = {static_cast<std::int64_t>(bytes)};
  d.strides = {1};
  d.data = 1 << 20;
  d.region_begin = d.data;
  d.region_bytes = bytes;
  d.exporter_address = "127.0.0.1";
  d.exporter_port = port;
  return d;
}

std::uint16_t hostile_listens(peer_process& hostile, const std::string& mode, std::uint64_t bytes) {
  std::optional<std::string> line = hostile.ask("listen " + mode + " " + std::to_string(bytes));
  REQUIRE(line);
  REQUIRE(line->rfind("listening ", 0) == 0);
  return static_cast<std::uint16_t>(std::stoi(line->substr(10)));
}

// A TCP listener on loopback that takes connections (the kernel completes
// them) and never says a word: UCX's connection to it is never wired up.
class mute_listener {
 public:
  mute_listener() { std::tie(fd_, port_) = loopback_socket(16); }
  mute_listener(const mute_listener&) = delete;
  mute_listener& operator=(const mute_listener&) = delete;
  ~mute_listener() { close(fd_); }
  std::uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

// The hostile peer's answer to a hold: "reply <code> <hold_id> <secret>
// <plan> <pieces> <bytes received> <reply flags> <bytes with the reply>".
struct grant_reply {
  int code = -1;
  std::uint64_t hold_id = 0;
  std::uint64_t secret = 0;
  std::uint64_t plan = 0;
  std::uint64_t pieces = 0;
  std::uint64_t received = 0;
  std::uint64_t flags = 0;
  std::uint64_t with_reply = 0;
};

grant_reply grant_of(const std::optional<std::string>& line) {
  REQUIRE(line);
  INFO(*line);
  std::istringstream in(*line);
  std::string word;
  grant_reply g;
  in >> word >> g.code >> g.hold_id >> g.secret >> g.plan >> g.pieces >> g.received >> g.flags >>
      g.with_reply;
  REQUIRE(word == "reply");
  REQUIRE_FALSE(in.fail());  // every field there
  return g;
}

}  // namespace

TEST_CASE("a descriptor names its tensor only: an altered one reads nothing else of the exporter",
          "[remote][hostile]") {
  // Before: the importer chose the addresses the exporter's UCX read (RMA
  // gets, or fetch requests checked against a region the descriptor
  // declared), so a descriptor pointed at another buffer returned its bytes.
  const std::string transports = GENERATE(std::string("shm"), std::string("tcp"));
  INFO("transports " << transports);
  auto peer = start_peer(transports);
  auto in = make_importer(transports);
  const remote_descriptor good =
      descriptor_from(peer->ask("publish 1:8:1 contiguous 65536 2 20000 5"));
  std::optional<std::string> line = peer->ask("secret 65536");
  REQUIRE(line);
  const std::uint64_t secret = std::stoull(line->substr(7));

  remote_descriptor d = good;
  d.data = secret;
  d.region_begin = secret;
  require_refused(import_now(*in->node, d), absl::StatusCode::kInvalidArgument, "lease",
                  "does not describe the tensor published under lease");
  // A region widened over the secret changes nothing the exporter sends.
  d = good;
  d.region_begin = std::min(good.region_begin, secret);
  d.region_bytes = std::max(good.region_begin, secret) + 65536 - d.region_begin;
  absl::StatusOr<tensor> t = import_now(*in->node, d);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  check_bytes(*t, "contiguous", {65536}, dtypes::uint8, 5);
  // Importers cannot ask to read the memory themselves: the exporter does
  // not trust its peers with RMA, and this node cannot even ask.
  auto hostile = start_hostile(transports);
  connect(*hostile, good);
  REQUIRE_THAT(*hostile->ask("hold " + hex(good) + " 0 0"), Catch::StartsWith("reply 7 "));
  remote_node_options o;
  o.fetch = remote_fetch::rma;
  REQUIRE(remote_node::create(*in->rt, o).status().code() == absl::StatusCode::kInvalidArgument);
  // Nothing was consumed by the refusals: the second importer still gets it.
  t = import_now(*in->node, good);
  REQUIRE(t.ok());
  check_bytes(*t, "contiguous", {65536}, dtypes::uint8, 5);
  REQUIRE(peer_reaches(*peer, "deleted", 1));
}

TEST_CASE("only its holder releases a hold, and memory outlives every granted read",
          "[remote][hostile]") {
  // Before: any peer's hold_release for the lease released it, and the
  // exporter freed 64 MiB under an importer's read (use after free).
  auto peer = start_peer("shm");
  auto in = make_importer("shm");
  const remote_descriptor d =
      descriptor_from(peer->ask("publish 1:8:1 contiguous 67108864 1 60000 9"));
  auto hostile = start_hostile("shm");
  connect(*hostile, d);
  // A forged description takes no hold, and so ends nothing.
  REQUIRE_THAT(*hostile->ask("hold " + hex(d) + " 1 1"), Catch::StartsWith("reply 3 "));
  std::future<absl::StatusOr<tensor>> f = async_import_remote(*in->node, d, {}, asio::use_future);
  // Releases with guessed holds and secrets, while the bytes move.
  for (int round = 0; round < 20 && f.wait_for(0s) != std::future_status::ready; ++round) {
    REQUIRE(hostile->ask("forge_releases " + std::to_string(d.lease_id) + " 256") == "sent");
  }
  REQUIRE(f.wait_for(60s) == std::future_status::ready);
  absl::StatusOr<tensor> t = f.get();
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  check_bytes(*t, "contiguous", {67108864}, dtypes::uint8, 9);
  REQUIRE(peer_reaches(*peer, "deleted", 1));
}

TEST_CASE("an importer that never takes its bytes holds the memory only until the lease ends",
          "[remote][hostile]") {
  // Without a bound, a rendezvous the importer neither receives nor drops
  // kept the exporter's send, and the published memory with it, for good.
  const std::string transports = GENERATE(std::string("shm"), std::string("tcp"));
  INFO("transports " << transports);
  auto peer = start_peer(transports);
  const remote_descriptor d =
      descriptor_from(peer->ask("publish 1:8:1 contiguous 16777216 1 1500 3"));
  auto hostile = start_hostile(transports);
  connect(*hostile, d);
  REQUIRE(hostile->ask("keep_pieces") == "keeping");
  REQUIRE_THAT(*hostile->ask("hold " + hex(d) + " 1 0"), Catch::StartsWith("reply 0 "));
  REQUIRE(peer_count(*peer, "deleted") == 0);
  // At the lease's end the exporter cuts the stalled importer off.
  REQUIRE(peer_reaches(*peer, "deleted", 1));
  REQUIRE(peer_count(*peer, "publications") == 0);
  REQUIRE(peer->ask("quit") == "bye 1");
}

TEST_CASE("a small tensor's bytes come with the grant, and its hold ends without a release",
          "[remote][hostile]") {
  // One message instead of a grant, a piece and a release: the exporter
  // ends the hold itself once its send no longer reads the memory, so a
  // producer published for one importer goes at once, not at the lease's
  // end, though the importer never releases anything.
  const std::string transports = GENERATE(std::string("shm"), std::string("tcp"));
  INFO("transports " << transports);
  auto peer = start_peer(transports);
  const remote_descriptor d = descriptor_from(peer->ask("publish 1:8:1 contiguous 4096 1 60000 5"));
  auto hostile = start_hostile(transports);
  connect(*hostile, d);
  // reply 0 <hold> <secret> <plan whole> <1 piece> <0 as pieces> <flags 1> <4096 with it>
  const grant_reply g = grant_of(hostile->ask("hold " + hex(d) + " 1 0 1"));
  CHECK(g.code == 0);
  CHECK(g.pieces == 1);
  CHECK(g.received == 0);
  CHECK(g.flags == 1);
  CHECK(g.with_reply == 4096);
  REQUIRE(peer_reaches(*peer, "deleted", 1));  // long before the lease's 60 s
  REQUIRE(peer_count(*peer, "publications") == 0);
  // The one hold was granted and ended: the lease is gone.
  REQUIRE_THAT(*hostile->ask("hold " + hex(d) + " 1 0 1"), Catch::StartsWith("reply 5 "));
  // Without the flag, or above 64 KiB, the bytes come as pieces, as before.
  const remote_descriptor big =
      descriptor_from(peer->ask("publish 1:8:1 contiguous 131072 1 60000 6"));
  const remote_descriptor plain =
      descriptor_from(peer->ask("publish 1:8:1 contiguous 4096 1 60000 7"));
  REQUIRE_THAT(*hostile->ask("hold " + hex(big) + " 1 0 1"),
               Catch::StartsWith("reply 0 ") && Catch::EndsWith(" 131072 0 0"));
  REQUIRE_THAT(*hostile->ask("hold " + hex(plain) + " 1 0 0"),
               Catch::StartsWith("reply 0 ") && Catch::EndsWith(" 4096 0 0"));
  REQUIRE(peer_count(*peer, "deleted") == 1);  // those two wait for their releases
  REQUIRE(peer->ask("quit") == "bye 3");
}

TEST_CASE("an importer that shuts down mid-transfer gives back its buffers and budget at once",
          "[remote][hostile]") {
  // Before: buffers with receives or gets under way were never freed (64 to
  // 96 MiB held, their budget with them), and with both ends in one process
  // shutdown could hang.
  SECTION("the exporter in another process") {
    auto peer = start_peer("shm");
    auto in = make_importer("shm", 512ull << 20);
    std::vector<remote_descriptor> ds;
    for (int i = 0; i < 4; ++i) {
      ds.push_back(descriptor_from(
          peer->ask("publish 1:8:1 contiguous 67108864 1 60000 " + std::to_string(i))));
    }
    std::vector<std::future<absl::StatusOr<tensor>>> fs;
    for (const remote_descriptor& d : ds) {
      fs.push_back(async_import_remote(*in->node, d, {}, asio::use_future));
    }
    REQUIRE(testing::eventually([&] { return testing::copy_budget(*in->rt).in_use() > 0; }));
    in->node->shutdown();
    // What is still held belongs to imports that had landed: whole tensors.
    std::vector<absl::StatusOr<tensor>> results;
    for (auto& f : fs) {
      REQUIRE(f.wait_for(10s) == std::future_status::ready);
      results.push_back(f.get());
    }
    std::uint64_t landed = 0;
    for (const absl::StatusOr<tensor>& t : results) {
      if (t.ok()) {
        landed += t->byte_size();
      } else {
        REQUIRE(t.status().code() == absl::StatusCode::kCancelled);
      }
    }
    CHECK(testing::copy_budget(*in->rt).in_use() == landed);
    results.clear();
    CHECK(testing::copy_budget(*in->rt).in_use() == 0);
    // The exporter sees the connection go; its publications end with their
    // leases or with it, once each.
    peer->send("quit");
    REQUIRE(peer->read_line(120s) == "bye 4");
  }
  SECTION("both ends in this process") {
    node_pair nodes;
    std::vector<std::unique_ptr<published_tensor>> ps;
    std::vector<std::future<absl::StatusOr<tensor>>> fs;
    for (int i = 0; i < 4; ++i) {
      ps.push_back(publish_here(nodes.out(), "contiguous", {4096, 4096}));
      fs.push_back(async_import_remote(nodes.in(), ps.back()->descriptor, {}, asio::use_future));
    }
    REQUIRE(testing::eventually(
        [&] { return testing::copy_budget(*nodes.importer_->rt).in_use() > 0; }));
    std::future<void> down = std::async(std::launch::async, [&] { nodes.in().shutdown(); });
    REQUIRE(down.wait_for(30s) == std::future_status::ready);
    for (auto& f : fs) REQUIRE(f.wait_for(10s) == std::future_status::ready);
    nodes.out().shutdown();
    for (auto& p : ps) REQUIRE(p->count.calls.load() == 1);
  }
}

TEST_CASE("an import over a connection that is never made ends on every path, and shutdown too",
          "[remote][hostile][rma]") {
  // Between trusted peers, automatically, how the bytes come depends on the
  // lanes UCX wires up: the import waits for that. A connection that is
  // never made must not keep it.
  remote_node_options o;
  o.trusted_peers = true;
  o.fetch = remote_fetch::automatic;
  o.min_rma_bytes = 1;
  o.import_timeout = 1s;
  auto in = make_importer(o);
  mute_listener mute;
  remote_descriptor d = at_hostile_exporter(mute.port(), 4096);
  d.rkey = std::string(32, 'k');  // keyed: RMA is possible, so the lanes are asked
  SECTION("a listener that never answers: Unavailable at the timeout, and again afresh") {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<tensor> t = import_now(*in->node, d);
      const auto took = std::chrono::steady_clock::now() - start;
      INFO(t.status().ToString());
      REQUIRE(t.status().code() == absl::StatusCode::kUnavailable);
      REQUIRE_THAT(std::string(t.status().message()),
                   Catch::Contains("the connection to the exporter was not made within") &&
                       Catch::Contains("1000 ms"));
      REQUIRE(took >= 900ms);
      REQUIRE(took < 10s);
      REQUIRE(testing::eventually([&] { return in->node->imports_in_flight() == 0; }));
      REQUIRE(testing::copy_budget(*in->rt).in_use() == 0);
    }
  }
  SECTION("cancelled while it waits: Cancelled at once") {
    canceller cancel;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<tensor> t = cancel.cancelled_after<tensor>(
        100ms, [&](auto token) { async_import_remote(*in->node, d, {}, std::move(token)); });
    REQUIRE(t.status().code() == absl::StatusCode::kCancelled);
    REQUIRE(std::chrono::steady_clock::now() - start < 900ms);
    REQUIRE(testing::eventually([&] { return in->node->imports_in_flight() == 0; }));
  }
  SECTION("the node shuts down while it waits: Cancelled, within a bound") {
    // Untrusted too, where the hold request waits on the connection: before,
    // the close flushed it, which never ended, and UCX aborted the process
    // when the worker went.
    o.trusted_peers = GENERATE(true, false);
    INFO("trusted " << o.trusted_peers);
    in = make_importer(o);
    std::future<absl::StatusOr<tensor>> f =
        async_import_remote(*in->node, d, import_options{}, asio::use_future);
    std::this_thread::sleep_for(100ms);
    REQUIRE(in->node->imports_in_flight() == 1);
    const auto start = std::chrono::steady_clock::now();
    in->node->shutdown();
    REQUIRE(std::chrono::steady_clock::now() - start < 4s);
    REQUIRE(f.wait_for(5s) == std::future_status::ready);
    REQUIRE(f.get().status().code() == absl::StatusCode::kCancelled);
  }
  SECTION("a port nobody listens on: Unavailable, not a wait for the timeout") {
    remote_descriptor nobody = d;
    {
      mute_listener gone;
      nobody.exporter_port = gone.port();
    }
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<tensor> t = import_now(*in->node, nobody);
    INFO(t.status().ToString());
    REQUIRE(t.status().code() == absl::StatusCode::kUnavailable);
    REQUIRE_THAT(std::string(t.status().message()), Catch::Contains("connection to the exporter"));
    REQUIRE(std::chrono::steady_clock::now() - start < 900ms);
    REQUIRE(testing::eventually([&] { return in->node->imports_in_flight() == 0; }));
  }
}

TEST_CASE("a hostile exporter's answers are checked before they are used", "[remote][hostile]") {
  auto hostile = start_hostile();
  auto in = make_importer("");
  SECTION("2^63 microseconds left on the lease: believed up to a bound, no overflow") {
    // Before: sent + remaining overflowed a signed add (UBSan), and the hold
    // seemed to have ended before it began.
    const std::uint16_t port = hostile_listens(*hostile, "huge_remaining", 4096);
    absl::StatusOr<tensor> t = import_now(*in->node, at_hostile_exporter(port, 4096));
    INFO(t.status().ToString());
    REQUIRE(t.ok());
    const std::vector<unsigned char> sent = testing::pseudo_random(4096, 11);
    REQUIRE(std::memcmp(t->data(), sent.data(), sent.size()) == 0);
  }
  SECTION("pieces out of range, too long, at absurd offsets, twice: refused, never written") {
    const std::uint16_t port = hostile_listens(*hostile, "bad_pieces", 4096);
    absl::StatusOr<tensor> t = import_now(*in->node, at_hostile_exporter(port, 4096));
    REQUIRE(t.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE_THAT(std::string(t.status().message()), Catch::Contains("did not expect"));
  }
  SECTION("a grant that carries the bytes: taken as the only piece, checked as one") {
    const std::uint16_t port = hostile_listens(*hostile, "with_grant", 4096);
    absl::StatusOr<tensor> t = import_now(*in->node, at_hostile_exporter(port, 4096));
    INFO(t.status().ToString());
    REQUIRE(t.ok());
    const std::vector<unsigned char> sent = testing::pseudo_random(4096, 11);
    REQUIRE(std::memcmp(t->data(), sent.data(), sent.size()) == 0);
  }
  SECTION("a grant whose bytes are one short, or come unannounced: refused") {
    const std::string mode =
        GENERATE(std::string("with_grant_short"), std::string("unannounced_bytes"));
    INFO(mode);
    const std::uint16_t port = hostile_listens(*hostile, mode, 4096);
    absl::StatusOr<tensor> t = import_now(*in->node, at_hostile_exporter(port, 4096));
    REQUIRE(t.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE_THAT(std::string(t.status().message()),
                 Catch::Contains(mode == "with_grant_short" ? "holds 4095 bytes" : "carries 4096"));
    // Given back as the import winds down, maybe a moment after the result.
    REQUIRE(testing::eventually([&] { return testing::copy_budget(*in->rt).in_use() == 0; }));
  }
  SECTION("a grant that carries more than a small tensor: refused") {
    const std::uint16_t port = hostile_listens(*hostile, "with_grant", 131072);
    absl::StatusOr<tensor> t = import_now(*in->node, at_hostile_exporter(port, 131072));
    REQUIRE(t.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE_THAT(std::string(t.status().message()), Catch::Contains("up to 65536 bytes"));
  }
  SECTION("an unknown status code and a message without its end") {
    const std::uint16_t port = hostile_listens(*hostile, "garbage", 4096);
    absl::StatusOr<tensor> t = import_now(*in->node, at_hostile_exporter(port, 4096));
    REQUIRE(t.status().code() == absl::StatusCode::kUnknown);
    REQUIRE(t.status().message().size() < 400);
  }
  SECTION("an exporter that never answers: Unavailable once silent past half the timeout") {
    // Before: DeadlineExceeded, and the silent connection stayed cached for
    // the next import from the exporter.
    auto fast = make_importer("", 0, false, 1s);
    const std::uint16_t port = hostile_listens(*hostile, "silent", 4096);
    for (int attempt = 0; attempt < 2; ++attempt) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<tensor> t = import_now(*fast->node, at_hostile_exporter(port, 4096));
      const auto took = std::chrono::steady_clock::now() - start;
      INFO(t.status().ToString());
      REQUIRE(t.status().code() == absl::StatusCode::kUnavailable);
      REQUIRE_THAT(
          std::string(t.status().message()),
          Catch::Contains("nothing came from the exporter") && Catch::Contains("taken as lost"));
      REQUIRE(took < 10s);
      REQUIRE(testing::eventually([&] { return testing::copy_budget(*fast->rt).in_use() == 0; }));
      REQUIRE(fast->node->imports_in_flight() == 0);
    }
    fast.reset();
  }
  SECTION("an exporter heard from that never answers one hold: that import is forgotten") {
    // Before: the import ended at its timeout, but stayed in the node's
    // table until shutdown, for an answer that never came.
    auto fast = make_importer("", 0, false, 2s);
    const std::uint16_t port = hostile_listens(*hostile, "lease_7_silent", 4096);
    remote_descriptor never = at_hostile_exporter(port, 4096);
    never.lease_id = 7;
    std::future<absl::StatusOr<tensor>> stuck =
        async_import_remote(*fast->node, never, import_options{}, asio::use_future);
    // Imports of another lease keep the exporter heard from meanwhile.
    const auto start = std::chrono::steady_clock::now();
    int served = 0;
    while (stuck.wait_for(0s) != std::future_status::ready &&
           std::chrono::steady_clock::now() - start < 20s) {
      absl::StatusOr<tensor> t = import_now(*fast->node, at_hostile_exporter(port, 4096));
      INFO(t.status().ToString());
      REQUIRE(t.ok());
      ++served;
      std::this_thread::sleep_for(20ms);
    }
    REQUIRE(stuck.wait_for(0s) == std::future_status::ready);
    absl::StatusOr<tensor> s = stuck.get();
    INFO(s.status().ToString());
    REQUIRE(s.status().code() == absl::StatusCode::kDeadlineExceeded);
    REQUIRE_THAT(std::string(s.status().message()), Catch::Contains("the exporter is slow"));
    REQUIRE(served > 5);
    // Forgotten one import_timeout after it ended.
    REQUIRE(testing::eventually([&] { return fast->node->imports_in_flight() == 0; }));
    REQUIRE(testing::eventually([&] { return testing::copy_budget(*fast->rt).in_use() == 0; }));
    // The connection still serves.
    REQUIRE(import_now(*fast->node, at_hostile_exporter(port, 4096)).ok());
    fast.reset();
  }
  SECTION("every active-message id instead of an answer") {
    const std::uint16_t port = hostile_listens(*hostile, "every_id", 4096);
    import_options o;
    std::future<absl::StatusOr<tensor>> f =
        async_import_remote(*in->node, at_hostile_exporter(port, 4096), o, asio::use_future);
    // No answer comes: the import is cancelled, and the node still works.
    std::this_thread::sleep_for(2s);
    REQUIRE(in->node->imports_in_flight() == 1);
    in->node->shutdown();
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
    REQUIRE(f.get().status().code() == absl::StatusCode::kCancelled);
  }
  in.reset();
  REQUIRE(hostile->ask("quit") == "bye");
}

TEST_CASE("a descriptor's bytes never reach UCX's parsers", "[remote][hostile]") {
  // Before: the descriptor carried the exporter's packed worker address and
  // remote key, which the importer handed to UCX (a mutated key crashed it,
  // a mutated address aborted it). Now it names a listener; the key, where
  // there is one, is read only between trusted peers.
  node_pair nodes;
  auto p = publish_here(nodes.out(), "contiguous", {64, 64});
  remote_descriptor d = p->descriptor;
  REQUIRE(d.rkey.empty());
  d.rkey = std::string(200, '\xff');  // ignored: this node does not trust its peers
  absl::StatusOr<tensor> t = import_now(nodes.in(), d);
  REQUIRE(t.ok());
  check_bytes(*t, "contiguous", {64, 64}, dtypes::float32, 1);
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));

  std::string bytes = d.encode();
  // The address field's length says 5 bytes: neither IPv4 nor IPv6.
  const std::size_t at = bytes.size() - (4 + d.rkey.size()) - 2 - 4 - 4;
  REQUIRE(bytes[at] == 4);
  bytes[at] = 5;
  bytes.insert(at + 4 + 4, 1, '\0');
  absl::StatusOr<remote_descriptor> r = remote_descriptor::decode(bytes);
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(r.status().message()), Catch::Contains("exporter address holds 5"));

  remote_descriptor elsewhere = p->descriptor;
  elsewhere.exporter_port = 1;  // nothing listens there
  auto fast = std::make_unique<importer>();
  fast->rt = testing::make_runtime(2);
  remote_node_options o;
  o.import_timeout = 3s;
  fast->node = *remote_node::create(*fast->rt, o);
  t = import_now(*fast->node, elsewhere);
  REQUIRE_FALSE(t.ok());
  REQUIRE((t.status().code() == absl::StatusCode::kUnavailable ||
           t.status().code() == absl::StatusCode::kDeadlineExceeded));
  elsewhere.exporter_port = 0;
  require_refused(import_now(*fast->node, elsewhere), absl::StatusCode::kInvalidArgument,
                  "remote_region", "names no exporter");
}

TEST_CASE("a peer's garbage active messages reach no handler slot that is not the node's",
          "[remote][hostile]") {
  // Before: ids 0, 1 and 0x51 called uninitialised slots of UCX 1.13's
  // handler table (a crash under ASan), and short or long headers of the
  // node's own ids were read as they came.
  node_pair nodes;
  auto p = publish_here(nodes.out(), "every_other_row", {32, 32});
  auto hostile = start_hostile();
  connect(*hostile, p->descriptor);
  REQUIRE_THAT(*hostile->ask("every_id 40 100"), Catch::StartsWith("sent 65536"));
  for (unsigned id = 0x4c01; id <= 0x4c05; ++id) {
    for (const auto& [header, data] : std::vector<std::pair<int, int>>{
             {0, 0}, {7, 0}, {32, 0}, {48, 0}, {56, 0}, {56, 1 << 20}, {248, 0}, {300, 9}}) {
      REQUIRE(hostile->ask("send " + std::to_string(id) + " 1 " + std::to_string(header) + " " +
                           std::to_string(data) + " " + std::to_string(id + header)) == "sent");
    }
  }
  // The node still serves its importers, and nothing was released.
  absl::StatusOr<tensor> t = import_now(nodes.in(), p->descriptor);
  REQUIRE(t.ok());
  check_bytes(*t, "every_other_row", {32, 32}, dtypes::float32, 1);
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
  REQUIRE(hostile->ask("quit") == "bye");
}

}  // namespace dlasync

namespace dlasync {

TEST_CASE("a node's listener takes at most max_connections importers at once",
          "[remote][hostile]") {
  auto out = std::make_unique<importer>();
  out->rt = testing::make_runtime(2);
  remote_node_options o;
  o.max_connections = 1;
  out->node = *remote_node::create(*out->rt, o);
  publish_options po;
  po.importers = 2;
  auto p = publish_here(*out->node, "contiguous", {16, 16}, po);
  auto first = make_importer("");
  auto second = make_importer("");
  REQUIRE(import_now(*first->node, p->descriptor).ok());
  REQUIRE(out->node->connections() == 1);
  // The first importer keeps its connection: the second is refused.
  absl::StatusOr<tensor> t = import_now(*second->node, p->descriptor);
  REQUIRE(t.status().code() == absl::StatusCode::kUnavailable);
  REQUIRE(out->node->connections() == 1);
  // Once it goes, there is room again.
  first.reset();
  REQUIRE(testing::eventually([&] { return out->node->connections() == 0; }));
  auto third = make_importer("");
  t = import_now(*third->node, p->descriptor);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
  std::unique_ptr<runtime> rt = testing::make_runtime(1);
  remote_node_options none;
  none.max_connections = 0;
  absl::StatusOr<std::unique_ptr<remote_node>> refused = remote_node::create(*rt, none);
  REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(refused.status().message()), Catch::Contains("max_connections = 0"));
}

}  // namespace dlasync

namespace dlasync {

TEST_CASE("an exporter sends a strided tensor run by run only where runs pay on the transport",
          "[remote][hostile]") {
  // Measured (docs/remote.md, dlasync_bench_remote --strided): over shared
  // memory, runs of 16 to 64 KiB (sent eagerly) beat the exporter's
  // gathered copy and longer ones (UCX's rendezvous) did not; over TCP,
  // runs paid only from 256 KiB. Before, runs of 16 KiB and up went one by
  // one on every transport.
  using row_case =
      std::tuple<std::string, std::int64_t, std::int64_t, std::uint64_t, std::uint64_t>;
  // transports, rows, floats a row, min_run_bytes, the plan (3: runs, 4: gathered)
  const auto [transports, rows, floats, min_run, plan] =
      GENERATE(row_case{"shm", 4, 8192, 0, 3}, row_case{"shm", 4, 32768, 0, 4},
               row_case{"tcp", 4, 8192, 0, 4}, row_case{"tcp", 4, 65536, 0, 3},
               // The node's own min_run_bytes decides alone, on any transport.
               row_case{"tcp", 4, 8192, 1, 3}, row_case{"shm", 4, 32768, 1, 3},
               // A gathered copy of 9 MiB goes in pieces of 4 MiB (before: one).
               row_case{"tcp", 288, 8192, 0, 4});
  INFO("transports " << transports << ", " << rows << " rows of " << floats * 4
                     << " bytes, min_run_bytes " << min_run);
  remote_node_options o;
  o.transports = transports;
  o.min_run_bytes = min_run;
  auto out = make_importer(o);
  auto p = publish_here(*out->node, "every_other_row", {rows, floats});
  auto hostile = start_hostile(transports);
  connect(*hostile, p->descriptor);
  const grant_reply g = grant_of(hostile->ask("hold " + hex(p->descriptor) + " 1 0"));
  REQUIRE(g.code == 0);
  CHECK(g.plan == plan);  // 3: runs, 4: gathered
  const std::uint64_t bytes = static_cast<std::uint64_t>(rows * floats) * sizeof(float);
  CHECK(g.pieces == (plan == 3 ? static_cast<std::uint64_t>(rows)
                               : (bytes + remote_detail::max_piece_bytes - 1) /
                                     remote_detail::max_piece_bytes));
  CHECK(g.received == bytes);
  REQUIRE(hostile->ask("release " + std::to_string(p->descriptor.lease_id) + " " +
                       std::to_string(g.hold_id) + " " + std::to_string(g.secret)) == "sent");
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
  REQUIRE(hostile->ask("quit") == "bye");
}

TEST_CASE("a node listening on every interface names the address it advertises",
          "[remote][hostile]") {
  // Before: a node listening on 0.0.0.0 named 0.0.0.0 in its descriptors,
  // which an importer on another host cannot reach (on Linux, a connection
  // to it goes to the importer's own host).
  std::unique_ptr<runtime> rt = testing::make_runtime(1);
  auto refused_with = [&](const remote_node_options& o, const std::string& words) {
    absl::StatusOr<std::unique_ptr<remote_node>> n = remote_node::create(*rt, o);
    INFO(n.status().ToString());
    REQUIRE(n.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(n.status().message()), Catch::Contains(words));
  };
  remote_node_options o;
  for (const char* wildcard : {"0.0.0.0", "::", "::ffff:0.0.0.0"}) {
    o.listen_address = wildcard;
    refused_with(o, "set remote_node_options::advertised_address");
  }
  o.listen_address = "0.0.0.0";
  for (const char* bad : {"exporter.example", "0.0.0.0", "::", "::ffff:0.0.0.0", "10.0.0.256"}) {
    o.advertised_address = bad;
    refused_with(o, "numeric IPv4 or IPv6 address that names a host");
  }
  o.listen_address.clear();
  o.advertised_address = "127.0.0.1";
  refused_with(o, "the node does not listen");

  // On every interface, advertising loopback: descriptors name it.
  auto out = std::make_unique<importer>();
  out->rt = testing::make_runtime(2);
  o.listen_address = "0.0.0.0";
  absl::StatusOr<std::unique_ptr<remote_node>> n = remote_node::create(*out->rt, o);
  INFO(n.status().ToString());
  REQUIRE(n.ok());
  out->node = *std::move(n);
  REQUIRE(out->node->listen_address() == "0.0.0.0");
  REQUIRE(out->node->advertised_address() == "127.0.0.1");
  auto p = publish_here(*out->node, "contiguous", {16, 16});
  REQUIRE(p->descriptor.exporter_address == "127.0.0.1");
  auto in = make_importer("");
  absl::StatusOr<tensor> t =
      import_now(*in->node, *remote_descriptor::decode(p->descriptor.encode()));
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  check_bytes(*t, "contiguous", {16, 16}, dtypes::float32, 1);
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));

  // A descriptor naming a wildcard (made by hand, or by a node before
  // this) is refused before anything is asked of any exporter.
  auto q = publish_here(*out->node, "contiguous", {16, 16}, {}, 2);
  for (const char* wildcard : {"0.0.0.0", "::", "::ffff:0.0.0.0"}) {
    remote_descriptor wild = q->descriptor;
    wild.exporter_address = wildcard;
    absl::StatusOr<remote_descriptor> decoded = remote_descriptor::decode(wild.encode());
    REQUIRE(decoded.ok());
    require_refused(import_now(*in->node, *decoded), absl::StatusCode::kInvalidArgument,
                    "remote_region", "the wildcard address");
  }
  {
    // An address spelled otherwise is advertised as a decoded descriptor
    // spells it, so that descriptors compare equal after a round trip.
    auto spelled = std::make_unique<importer>();
    spelled->rt = testing::make_runtime(1);
    remote_node_options v6 = o;
    v6.advertised_address = "0:0:0:0:0:0:0:1";
    absl::StatusOr<std::unique_ptr<remote_node>> n6 = remote_node::create(*spelled->rt, v6);
    REQUIRE(n6.ok());
    REQUIRE((*n6)->advertised_address() == "::1");
    auto r = publish_here(**n6, "contiguous", {4}, {}, 3);
    REQUIRE(r->descriptor.exporter_address == "::1");
    REQUIRE(remote_descriptor::decode(r->descriptor.encode())->exporter_address == "::1");
    (*n6)->shutdown();
    REQUIRE(r->count.calls.load() == 1);
  }
  REQUIRE(in->node->imports_completed().sent_by_exporter == 1);
  // Its lease was never held: the right descriptor still imports.
  t = import_now(*in->node, q->descriptor);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  check_bytes(*t, "contiguous", {16, 16}, dtypes::float32, 2);
  REQUIRE(testing::eventually([&] { return q->count.calls.load() == 1; }));
}

TEST_CASE("a bundle's hold request is checked member by member before anything is granted",
          "[remote][hostile][bundle]") {
  auto peer = start_peer("tcp");
  std::optional<std::string> line = peer->ask(
      "publish_bundle 1:8:1 contiguous:4096,"
      "contiguous:8192,contiguous:100 1 20000 5");
  REQUIRE(line);
  REQUIRE(line->rfind("bundle ", 0) == 0);
  const std::string bundle_hex = line->substr(7);
  const remote_bundle b = *remote_bundle::decode(testing::from_hex(bundle_hex));
  auto hostile = start_hostile("tcp");
  connect(*hostile, b.members[0].descriptor);
  // Each refusal names what is wrong, and grants nothing: InvalidArgument (3).
  for (const auto& [variant, words] :
       std::vector<std::pair<std::string, std::string>>{{"repeat", "reply 3 "},
                                                        {"descending", "reply 3 "},
                                                        {"past_end", "reply 3 "},
                                                        {"wrong_digest", "reply 3 "},
                                                        {"ragged", "reply 3 "},
                                                        {"empty", "reply 3 "},
                                                        {"too_many", "reply 3 "},
                                                        {"rendezvous", "reply 3 "},
                                                        // Not trusted with RMA: PermissionDenied.
                                                        {"rma", "reply 7 "}}) {
    INFO(variant);
    std::string command = "hold_members " + bundle_hex;
    command += " " + variant;
    REQUIRE_THAT(*hostile->ask(command), Catch::StartsWith(words));
  }
  REQUIRE(peer_count(*peer, "deleted") == 0);
  // The honest list is granted, and every member's bytes come.
  const grant_reply g = grant_of(hostile->ask("hold_members " + bundle_hex + " honest"));
  REQUIRE(g.code == 0);
  REQUIRE(g.pieces == 3);
  REQUIRE(g.received == 4096 + 8192 + 100);
  REQUIRE(hostile->ask("release " + std::to_string(b.lease_id) + " " + std::to_string(g.hold_id) +
                       " " + std::to_string(g.secret)) == "sent");
  REQUIRE(peer_reaches(*peer, "deleted", 3));

  // Small members all in the grant: the hold ends with it, no release.
  line = peer->ask("publish_bundle 1:8:1 contiguous:4096,contiguous:100 1 20000 5");
  REQUIRE(line);
  const std::string small_hex = line->substr(7);
  const grant_reply with = grant_of(hostile->ask("hold_members " + small_hex + " with_grant"));
  REQUIRE(with.code == 0);
  REQUIRE(with.hold_id == 0);
  REQUIRE(with.flags == 1);
  // Two plans, a packed header, two records, and the bytes.
  REQUIRE(with.with_reply == 2 * 16 + 24 + 2 * 16 + 4096 + 100);
  REQUIRE(peer_reaches(*peer, "deleted", 5));
  // Up to 64 KiB of one-piece members in all, whatever their sizes, go with
  // the grant; a byte more, and the hold is granted for the pieces.
  for (const auto& [members, in_grant] : std::vector<std::pair<std::string, bool>>{
           {"contiguous:65536,contiguous:0", true}, {"contiguous:65536,contiguous:1", false}}) {
    INFO(members);
    line = peer->ask("publish_bundle 1:8:1 " + members + " 1 20000 5");
    REQUIRE(line);
    const grant_reply big =
        grant_of(hostile->ask("hold_members " + line->substr(7) + " with_grant"));
    REQUIRE(big.code == 0);
    REQUIRE(big.flags == (in_grant ? 1U : 0U));
    REQUIRE((big.hold_id == 0) == in_grant);
    if (!in_grant) {
      REQUIRE(big.received == 65537);
      const remote_bundle granted = *remote_bundle::decode(testing::from_hex(line->substr(7)));
      REQUIRE(hostile->ask("release " + std::to_string(granted.lease_id) + " " +
                           std::to_string(big.hold_id) + " " + std::to_string(big.secret)) ==
              "sent");
    }
  }
  REQUIRE(peer_reaches(*peer, "deleted", 9));
  REQUIRE(hostile->ask("quit") == "bye");
  REQUIRE(peer->ask("quit") == "bye 9");
}

TEST_CASE("a hostile exporter's bundle grant and pieces are checked before they are used",
          "[remote][hostile][bundle]") {
  auto hostile = start_hostile();
  auto in = make_importer("");
  auto bundle_at = [](std::uint16_t port) {
    remote_bundle b;
    b.lease_id = 1;
    b.exporter_address = "127.0.0.1";
    b.exporter_port = port;
    b.published = 2;
    for (std::uint32_t i = 0; i < 2; ++i) {
      remote_bundle::member m;
      m.index = i;
      m.descriptor = at_hostile_exporter(port, 4096);
      b.members.push_back(m);
    }
    return b;
  };
  auto import_bundle = [&](std::uint16_t port) {
    std::future<absl::StatusOr<std::vector<tensor>>> f =
        async_import_remote_bundle(*in->node, bundle_at(port), {}, asio::use_future);
    REQUIRE(f.wait_for(60s) == std::future_status::ready);
    return f.get();
  };
  SECTION("an honest grant and pieces: both members arrive") {
    absl::StatusOr<std::vector<tensor>> t =
        import_bundle(hostile_listens(*hostile, "bundle_honest", 4096));
    INFO(t.status().ToString());
    REQUIRE(t.ok());
    const std::vector<unsigned char> sent = testing::pseudo_random(4096, 11);
    for (const tensor& member : *t) {
      REQUIRE(std::memcmp(member.data(), sent.data(), sent.size()) == 0);
    }
  }
  SECTION("a grant whose plans do not cover every member: refused") {
    absl::StatusOr<std::vector<tensor>> t =
        import_bundle(hostile_listens(*hostile, "bundle_plans_short", 4096));
    REQUIRE(t.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE_THAT(std::string(t.status().message()),
                 Catch::Contains("not a plan for each of its 2"));
  }
  SECTION("members packed in one message: taken, each checked as a piece") {
    absl::StatusOr<std::vector<tensor>> t =
        import_bundle(hostile_listens(*hostile, "bundle_packed", 4096));
    INFO(t.status().ToString());
    REQUIRE(t.ok());
    const std::vector<unsigned char> sent = testing::pseudo_random(4096, 11);
    for (const tensor& member : *t) {
      REQUIRE(std::memcmp(member.data(), sent.data(), sent.size()) == 0);
    }
  }
  SECTION("packed members that are short or twice, or a grant that ends the hold without all") {
    const auto [mode, words] = GENERATE(
        std::pair<std::string, std::string>{"bundle_packed_short", "member 0 holds 4095 bytes"},
        std::pair<std::string, std::string>{"bundle_packed_twice", "or comes twice"},
        std::pair<std::string, std::string>{"bundle_packed_rndv", "by rendezvous"},
        std::pair<std::string, std::string>{"bundle_grant_partial",
                                            "the grant carries 1 of 2 pieces"});
    INFO(mode);
    absl::StatusOr<std::vector<tensor>> t = import_bundle(hostile_listens(*hostile, mode, 4096));
    INFO(t.status().ToString());
    REQUIRE(t.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE_THAT(std::string(t.status().message()), Catch::Contains(words));
  }
  SECTION("a piece of a member that was not asked for: refused, never written") {
    absl::StatusOr<std::vector<tensor>> t =
        import_bundle(hostile_listens(*hostile, "bundle_wrong_member", 4096));
    REQUIRE(t.status().code() == absl::StatusCode::kDataLoss);
    REQUIRE_THAT(std::string(t.status().message()), Catch::Contains("of member 2"));
  }
  REQUIRE(testing::eventually([&] { return testing::copy_budget(*in->rt).in_use() == 0; }));
  in.reset();
  REQUIRE(hostile->ask("quit") == "bye");
}

}  // namespace dlasync
