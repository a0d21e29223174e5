// Bundles: several tensors published under one lease, imported with one
// hold, every member's bytes in flight together, and one release. From
// another process (tests/remote/remote_peer.cpp) over shared memory and TCP,
// and the contract within one process. Every producer deleter is counted.
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "asio/bind_cancellation_slot.hpp"
#include "asio/bind_executor.hpp"
#include "asio/cancellation_signal.hpp"
#include "asio/io_context.hpp"
#include "asio/post.hpp"
#include "asio/strand.hpp"
#include "asio/use_future.hpp"
#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "dlasync/remote.hpp"
#include "remote/remote_fixture.hpp"
#include "remote/remote_support.hpp"
#include "support/copy_budget.hpp"
#include "support/runtime_fixture.hpp"
#include "support/sim_runtime.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {

TEST_CASE("a bundle crosses from another process with one hold, every member intact",
          "[remote][bundle]") {
  const std::string transports = GENERATE(std::string("shm"), std::string("tcp"));
  INFO("transports " << transports);
  auto peer = start_peer(transports);
  auto in = make_importer(transports);
  // Every layout, a 0-d and a size-0 member, and members large enough to go
  // by rendezvous, side by side.
  std::vector<member_spec> members = every_layout_members();
  members.push_back({"transposed", {256, 512}});
  const remote_bundle b = publish_on_peer(*peer, members, 40);
  REQUIRE(b.members.size() == members.size());
  REQUIRE(b.published == members.size());
  REQUIRE(remote_bundle::decode(b.encode())->encode() == b.encode());
  absl::StatusOr<std::vector<tensor>> got = import_bundle_now(*in->node, b);
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  check_bundle(*got, members, 40);
  // One hold for all: released once, and every producer with it.
  const int n = static_cast<int>(members.size());
  require_released(*peer, n, *in, got);

  // Many small members: one hold, every piece in flight together.
  std::vector<member_spec> small(256, member_spec{"contiguous", {32, 32}});
  const remote_bundle many = publish_on_peer(*peer, small, 7);
  got = import_bundle_now(*in->node, many);
  REQUIRE(got.ok());
  REQUIRE(got->size() == small.size());
  for (std::size_t i = 0; i < small.size(); i += 51) {
    check_bytes((*got)[i], "contiguous", {32, 32}, dtypes::float32, 7 + static_cast<unsigned>(i));
  }
  REQUIRE(peer_reaches(*peer, "deleted", n + 256));
  REQUIRE(peer->ask("quit") == "bye " + std::to_string(n + 256));
  REQUIRE(peer->wait_exit() == 0);
}

TEST_CASE("a bundle's members can be taken in part, by several importers under one lease",
          "[remote][bundle]") {
  auto peer = start_peer("tcp");
  auto in = make_importer("tcp");
  const std::vector<member_spec> members = {{"contiguous", {8, 8}},
                                            {"every_other_row", {16, 4}},
                                            {"negative", {5, 7}},
                                            {"transposed", {9, 3}}};
  const remote_bundle b = publish_on_peer(*peer, members, 3, 2);
  // One member's descriptor alone does not name a bundle's lease.
  require_refused(import_now(*in->node, b.members[0].descriptor),
                  absl::StatusCode::kInvalidArgument, "lease", "is a bundle of 4 tensors");
  // Members 1 and 3, sent on as bytes.
  absl::StatusOr<remote_bundle> part = b.select({3, 1});
  REQUIRE(part.ok());
  absl::StatusOr<remote_bundle> carried = remote_bundle::decode(part->encode());
  REQUIRE(carried.ok());
  REQUIRE(carried->members.size() == 2);
  REQUIRE(carried->members[0].index == 1);
  REQUIRE(carried->members[1].index == 3);
  absl::StatusOr<std::vector<tensor>> got = import_bundle_now(*in->node, *carried);
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  REQUIRE(got->size() == 2);
  check_bytes((*got)[0], "every_other_row", {16, 4}, dtypes::float32, 4);
  check_bytes((*got)[1], "transposed", {9, 3}, dtypes::float32, 6);
  // Not released yet: the lease has a second importer, who takes them all.
  std::this_thread::sleep_for(50ms);
  REQUIRE(peer_count(*peer, "deleted") == 0);
  got = import_bundle_now(*in->node, b);
  REQUIRE(got.ok());
  for (std::size_t i = 0; i < members.size(); ++i) {
    check_bytes((*got)[i], members[i].layout, members[i].shape, dtypes::float32,
                3 + static_cast<unsigned>(i));
  }
  REQUIRE(peer_reaches(*peer, "deleted", 4));
  require_refused(import_bundle_now(*in->node, b), absl::StatusCode::kNotFound, "lease",
                  "is not published here");
  REQUIRE(b.select({}).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(b.select({1, 1}).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(b.select({4}).status().code() == absl::StatusCode::kOutOfRange);
  REQUIRE(peer->ask("quit") == "bye 4");
  REQUIRE(peer->wait_exit() == 0);
}

TEST_CASE("a bundle is refused as a whole before anything moves, naming the member",
          "[remote][bundle]") {
  node_pair nodes;
  const std::vector<member_spec> members = {
      {"contiguous", {16, 16}}, {"transposed", {8, 4}}, {"contiguous", {4}}};
  auto p = publish_bundle_here(nodes.out(), members);
  const remote_bundle& b = p->bundle;
  SECTION("a member described otherwise: the exporter refuses the hold, and grants the next") {
    remote_bundle altered = b;
    altered.members[1].descriptor.shape = {4, 4};  // still inside its region
    require_refused(import_bundle_now(nodes.in(), altered), absl::StatusCode::kInvalidArgument,
                    "lease", "member 1 of the bundle does not describe");
  }
  SECTION("a member that reaches past its region: refused here, by its place") {
    remote_bundle altered = b;
    altered.members[2].descriptor.region_bytes = 8;
    require_refused(import_bundle_now(nodes.in(), altered), absl::StatusCode::kInvalidArgument,
                    "remote_region", "bundle member 2 of 3");
  }
  SECTION("a member of another lease, or out of order, or none") {
    remote_bundle other = b;
    other.members[1].descriptor.lease_id ^= 1;
    require_refused(import_bundle_now(nodes.in(), other), absl::StatusCode::kInvalidArgument,
                    "bundle", "bundle member 1 names lease");
    remote_bundle swapped = b;
    std::swap(swapped.members[0], swapped.members[1]);
    require_refused(import_bundle_now(nodes.in(), swapped), absl::StatusCode::kInvalidArgument,
                    "bundle", "indices rise");
    remote_bundle empty = b;
    empty.members.clear();
    require_refused(import_bundle_now(nodes.in(), empty), absl::StatusCode::kInvalidArgument,
                    "bundle", "has 0 members");
  }
  SECTION("members that together exceed the whole budget, though each fits") {
    auto small = make_importer("", /*budget=*/1100);  // 1,024 + 128 + 16 bytes
    require_refused(import_bundle_now(*small->node, b), absl::StatusCode::kResourceExhausted,
                    "budget", "remote bundle");
  }
  // None of it consumed a hold: the bundle's one importer takes it whole.
  REQUIRE(p->count.calls.load() == 0);
  absl::StatusOr<std::vector<tensor>> got = import_bundle_now(nodes.in(), b);
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  for (std::size_t i = 0; i < members.size(); ++i) {
    check_bytes((*got)[i], members[i].layout, members[i].shape, dtypes::float32,
                1 + static_cast<unsigned>(i));
  }
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 3; }));
  REQUIRE(nodes.out().publications() == 0);
}

TEST_CASE("small members come packed: in the grant when all fit, else several to a message",
          "[remote][bundle]") {
  node_pair nodes;
  // All in the grant: the hold ends with it, and the producers go.
  const std::vector<member_spec> few = {
      {"contiguous", {16}}, {"transposed", {4, 4}}, {"contiguous", {4, 0}}, {"negative", {3, 5}}};
  auto p = publish_bundle_here(nodes.out(), few, {}, 20);
  absl::StatusOr<std::vector<tensor>> got = import_bundle_now(nodes.in(), p->bundle);
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  for (std::size_t i : {0, 1, 3}) {
    check_bytes((*got)[i], few[i].layout, few[i].shape, dtypes::float32,
                20 + static_cast<unsigned>(i));
  }
  REQUIRE((*got)[2].byte_size() == 0);
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 4; }));
  // 40 members of 4 KiB: more than one message holds, and a large member
  // beside them goes apart.
  std::vector<member_spec> many(40, member_spec{"contiguous", {32, 32}});
  many.push_back({"contiguous", {256, 256}});
  auto q = publish_bundle_here(nodes.out(), many, {}, 60);
  got = import_bundle_now(nodes.in(), q->bundle);
  REQUIRE(got.ok());
  for (std::size_t i = 0; i < many.size(); ++i) {
    check_bytes((*got)[i], many[i].layout, many[i].shape, dtypes::float32,
                60 + static_cast<unsigned>(i));
  }
  REQUIRE(testing::eventually([&] { return q->count.calls.load() == 41; }));
  // Members with no bytes at all.
  auto empty = publish_bundle_here(nodes.out(), {{"contiguous", {0}}, {"contiguous", {2, 0}}});
  got = import_bundle_now(nodes.in(), empty->bundle);
  REQUIRE(got.ok());
  REQUIRE(got->size() == 2);
  REQUIRE(testing::eventually([&] { return empty->count.calls.load() == 2; }));
  REQUIRE(nodes.out().publications() == 0);
}

TEST_CASE("publish_bundle refuses as a whole, naming the member, and consumes nothing",
          "[remote][bundle][publish]") {
  node_pair nodes;
  published_bundle p;
  std::vector<managed_tensor> sources =
      laid_out_tensors(p, {{"contiguous", {4, 4}}, {"contiguous", {2}}}, 1);
  testing::tensor_spec bad;
  bad.shape = {-1, 4};
  bad.data = p.memory[0]->data();
  sources.insert(sources.begin() + 1, testing::make_tensor(bad, p.count));
  absl::StatusOr<remote_bundle> b = nodes.out().publish_bundle(sources);
  REQUIRE(b.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(b.status().message()), Catch::Contains("bundle member 1 of 3"));
  for (const managed_tensor& t : sources) REQUIRE_FALSE(t.empty());
  REQUIRE(nodes.out().publish_bundle(std::span<managed_tensor>()).status().code() ==
          absl::StatusCode::kInvalidArgument);
  std::vector<managed_tensor> too_many(remote_bundle::max_members + 1);
  REQUIRE(nodes.out().publish_bundle(too_many).status().code() == absl::StatusCode::kOutOfRange);
  publish_options o;
  o.importers = 0;
  REQUIRE(nodes.out().publish_bundle(sources, o).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(p.count.calls.load() == 0);
  REQUIRE(nodes.out().publications() == 0);
  sources.clear();
  REQUIRE(p.count.calls.load() == 3);  // the caller's handles released them
}

TEST_CASE("imported tensors published as a bundle land on a simulated GPU",
          "[remote][bundle][publish]") {
  node_pair nodes;
  published_bundle p;
  std::vector<managed_tensor> sources =
      laid_out_tensors(p, {{"transposed", {32, 16}}, {"contiguous", {64}}}, 9);
  std::vector<tensor> views;
  for (managed_tensor& s : sources) {
    absl::StatusOr<tensor> v = import_view(*nodes.exporter->rt, s);
    REQUIRE(v.ok());
    views.push_back(*std::move(v));
  }
  absl::StatusOr<remote_bundle> b = nodes.out().publish_bundle(std::span<const tensor>(views));
  REQUIRE(b.ok());
  views.clear();
  REQUIRE(p.count.calls.load() == 0);  // the publication holds them

  testing::sim_runtime sim = testing::make_sim_runtime();
  auto gpu_node = remote_node::create(*sim.rt, {});
  REQUIRE(gpu_node.ok());
  import_options o;
  o.target = device{device_kind::cuda, 0};
  absl::StatusOr<std::vector<tensor>> got = import_bundle_now(**gpu_node, *b, o);
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  REQUIRE(got->size() == 2);
  REQUIRE(testing::eventually([&] { return p.count.calls.load() == 2; }));
  const char* layouts[] = {"transposed", "contiguous"};
  const std::vector<std::int64_t> shapes[] = {{32, 16}, {64}};
  for (std::size_t i = 0; i < 2; ++i) {
    REQUIRE((*got)[i].device() == (device{device_kind::cuda, 0}));
    // Back to the host through a local import, to compare.
    managed_tensor back(*(*got)[i].to_dlpack_versioned());
    import_options h;
    h.target = host_device;
    std::future<absl::StatusOr<tensor>> f = async_import_dlpack(*sim.rt, back, h, asio::use_future);
    REQUIRE(f.wait_for(30s) == std::future_status::ready);
    absl::StatusOr<tensor> host = f.get();
    REQUIRE(host.ok());
    check_bytes(*host, layouts[i], shapes[i], dtypes::float32, 9 + static_cast<unsigned>(i));
  }
  got = absl::StatusOr<std::vector<tensor>>(std::vector<tensor>{});
  (*gpu_node)->shutdown();
}

TEST_CASE("a cancelled bundle import ends with Cancelled, and every member is released once",
          "[remote][bundle][cancel]") {
  node_pair nodes;
  canceller cancel;
  std::vector<std::unique_ptr<published_bundle>> published;
  int cancelled = 0;
  for (int delay_us : {0, 200, 2000, 20000}) {
    INFO("cancelled after " << delay_us << " us");
    published.push_back(publish_bundle_here(
        nodes.out(), std::vector<member_spec>(8, member_spec{"contiguous", {1024, 512}})));
    absl::StatusOr<std::vector<tensor>> t = cancel.cancelled_after<std::vector<tensor>>(
        std::chrono::microseconds(delay_us), [&](auto token) {
          async_import_remote_bundle(nodes.in(), published.back()->bundle, {}, std::move(token));
        });
    if (!t.ok()) {
      ++cancelled;
      REQUIRE(t.status().code() == absl::StatusCode::kCancelled);
    }
  }
  REQUIRE(cancelled > 0);
  // Every hold is released, every producer freed once, every byte given back.
  for (auto& p : published) {
    REQUIRE(testing::eventually([&] { return p->count.calls.load() == 8; }));
  }
  REQUIRE(testing::eventually(
      [&] { return testing::copy_budget(*nodes.importer_->rt).in_use() == 0; }));
  REQUIRE(nodes.in().imports_in_flight() == 0);
}

TEST_CASE("a bundle's bytes are read back whole or refused, naming the field",
          "[remote][bundle][descriptor]") {
  remote_bundle b;
  b.lease_id = 77;
  b.exporter_address = "127.0.0.1";
  b.exporter_port = 4000;
  b.published = 5;
  for (std::uint32_t i : {0U, 2U, 4U}) {
    remote_bundle::member m;
    m.index = i;
    m.descriptor.shape = {3, static_cast<std::int64_t>(i) + 1};
    m.descriptor.strides = {static_cast<std::int64_t>(i) + 1, 1};
    m.descriptor.data = 4096 * (i + 1);
    m.descriptor.region_begin = m.descriptor.data;
    m.descriptor.region_bytes = 4 * 3 * (i + 1);
    b.members.push_back(m);
  }
  const std::string bytes = b.encode();
  absl::StatusOr<remote_bundle> back = remote_bundle::decode(bytes);
  REQUIRE(back.ok());
  REQUIRE(back->members.size() == 3);
  REQUIRE(back->members[2].index == 4);
  REQUIRE(back->members[2].descriptor.shape == std::vector<std::int64_t>{3, 5});
  REQUIRE(back->members[1].descriptor.lease_id == 77);
  REQUIRE(back->members[1].descriptor.exporter_port == 4000);
  REQUIRE(back->encode() == bytes);
  // Every cut is refused, never read past.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<remote_bundle> r = remote_bundle::decode(std::string_view(bytes).substr(0, n));
    INFO(n << " bytes: " << r.status().ToString());
    REQUIRE_FALSE(r.ok());
  }
  REQUIRE_THAT(std::string(remote_bundle::decode(bytes + "x").status().message()),
               Catch::Contains("after its end"));
  REQUIRE_THAT(
      std::string(remote_bundle::decode(b.members[0].descriptor.encode()).status().message()),
      Catch::Contains("do not start with \"DLRB\""));
  remote_bundle unordered = b;
  unordered.members[2].index = 1;
  REQUIRE_THAT(std::string(remote_bundle::decode(unordered.encode()).status().message()),
               Catch::Contains("member 2: index 1 after 2"));
  remote_bundle past = b;
  past.published = 4;
  REQUIRE_THAT(std::string(remote_bundle::decode(past.encode()).status().message()),
               Catch::Contains("member 2: index 4 after 2 of 4"));
  remote_bundle more = b;
  more.published = 2;
  REQUIRE(remote_bundle::decode(more.encode()).status().code() == absl::StatusCode::kOutOfRange);
  remote_bundle none = b;
  none.members.clear();
  REQUIRE(remote_bundle::decode(none.encode()).status().code() ==
          absl::StatusCode::kInvalidArgument);
  // A count that the bytes cannot hold allocates nothing: refused first.
  std::string huge = bytes;
  const std::size_t count_at = 4 + 2 + 2 + 8 + 4 + 4 + 2 + 4;
  std::memcpy(huge.data() + count_at - 4, "\x00\x10\x00\x00", 4);  // published 4096
  std::memcpy(huge.data() + count_at, "\x00\x10\x00\x00", 4);      // 4096 members
  REQUIRE_THAT(std::string(remote_bundle::decode(huge).status().message()),
               Catch::Contains("4096 members in"));
}

}  // namespace dlasync
