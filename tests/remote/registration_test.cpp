// Between trusted peers: bundles read by RMA, memory registered once for the
// members that share it, and registrations a user keeps for a pool, so that
// re-publishing its buffers registers nothing. From another process
// (tests/remote/remote_peer.cpp --trusted) over shared memory and TCP, and
// within one process. Every producer deleter is counted.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "dlasync/dlasync.hpp"
#include "dlasync/remote.hpp"
#include "remote/remote_fixture.hpp"
#include "remote/remote_support.hpp"
#include "remote/src/recent_map.hpp"
#include "support/copy_budget.hpp"
#include "support/runtime_fixture.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

// An importer that trusts its peers and reads as `fetch` says (and,
// automatically, by RMA from `min_rma_bytes` up).
std::unique_ptr<importer> trusted_importer(const std::string& transports, remote_fetch fetch,
                                           std::uint64_t min_rma_bytes = 0) {
  remote_node_options o;
  o.transports = transports;
  o.trusted_peers = true;
  o.fetch = fetch;
  o.min_rma_bytes = min_rma_bytes;
  return make_importer(o);
}

// How often `needle` occurs in `haystack`.
std::size_t occurrences(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

// A pool of `blocks` blocks of `floats` floats, each block's values
// (generation * 1e6 + block * 1e3 + i) telling which publication they
// belong to.
struct pool {
  std::vector<float> memory;
  std::int64_t floats = 0;
  pool(std::size_t blocks, std::int64_t floats)
      : memory(blocks * static_cast<std::size_t>(floats)), floats(floats) {}
  void fill(int generation) {
    for (std::size_t i = 0; i < memory.size(); ++i) {
      memory[i] = static_cast<float>(generation * 1000000 + static_cast<int>(i));
    }
  }
  float* block(std::size_t b) { return memory.data() + b * static_cast<std::size_t>(floats); }
};

// Blocks `first` .. `first + n` of `p`, published as one bundle with
// counting deleters.
remote_bundle publish_blocks(remote_node& node, pool& p, std::size_t first, std::size_t n,
                             testing::deleter_count& count) {
  std::vector<managed_tensor> sources;
  for (std::size_t b = first; b < first + n; ++b) {
    testing::tensor_spec spec;
    spec.shape = {p.floats};
    spec.data = p.block(b);
    sources.push_back(testing::make_tensor(spec, count));
  }
  absl::StatusOr<remote_bundle> bundle = node.publish_bundle(sources);
  INFO(bundle.status().ToString());
  REQUIRE(bundle.ok());
  return *bundle;
}

// The members hold blocks `first` .. of `p` as filled for `generation`.
void check_blocks(const std::vector<tensor>& got, pool& p, std::size_t first, int generation) {
  for (std::size_t k = 0; k < got.size(); ++k) {
    INFO("member " << k);
    REQUIRE(got[k].byte_size() == static_cast<std::uint64_t>(p.floats) * sizeof(float));
    const auto* f = static_cast<const float*>(got[k].data());
    const std::size_t base = (first + k) * static_cast<std::size_t>(p.floats);
    REQUIRE(f[0] == static_cast<float>(generation * 1000000 + static_cast<int>(base)));
    REQUIRE(std::memcmp(f, p.memory.data() + base, got[k].byte_size()) == 0);
  }
}

}  // namespace

TEST_CASE("between trusted peers a bundle is read by RMA, every member intact",
          "[remote][bundle][rma]") {
  const auto [transports, fetch] =
      GENERATE(std::pair<std::string, remote_fetch>{"shm", remote_fetch::rma},
               std::pair<std::string, remote_fetch>{"tcp", remote_fetch::rma},
               std::pair<std::string, remote_fetch>{"shm", remote_fetch::automatic});
  INFO("transports " << transports << ", fetch " << static_cast<int>(fetch));
  auto peer = start_peer(transports, /*trusted=*/true);
  // Automatically: by RMA where UCX has a lane (cma), from 1 byte up.
  auto in = trusted_importer(transports, fetch, 1);
  // Every layout, a 0-d and a size-0 member, and large members, each read
  // under the key of its own registration (the peer lays them out apart).
  const std::vector<member_spec> members = every_layout_members();
  const remote_bundle b = publish_on_peer(*peer, members, 60);
  for (std::size_t i = 0; i < b.members.size(); ++i) {
    INFO("member " << i);
    // Size 0 has no region, and no key.
    REQUIRE(b.members[i].descriptor.rkey.empty() == (b.members[i].descriptor.region_bytes == 0));
  }
  REQUIRE(remote_bundle::decode(b.encode())->encode() == b.encode());
  absl::StatusOr<std::vector<tensor>> got = import_bundle_now(*in->node, b);
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  check_bundle(*got, members, 60);
  // One hold, released once: every producer goes, and every registration.
  const int n = static_cast<int>(members.size());
  require_released(*peer, n, *in, got);
  // Imports of the same exporter again (its keys unpacked afresh or from
  // the connection's cache): a subset of a second bundle.
  const remote_bundle again = publish_on_peer(*peer, members, 9);
  absl::StatusOr<remote_bundle> part = again.select({0, 2, members.size() - 1});
  REQUIRE(part.ok());
  got = import_bundle_now(*in->node, *remote_bundle::decode(part->encode()));
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  check_bytes((*got)[2], "contiguous", {512, 1024}, dtypes::float32,
              9 + static_cast<unsigned>(members.size() - 1));
  REQUIRE(peer_reaches(*peer, "deleted", 2 * n));
  // A bundle with no bytes to move counts neither way.
  const std::vector<member_spec> empty_member = {{"contiguous", {4, 0, 3}}};
  got = import_bundle_now(*in->node, publish_on_peer(*peer, empty_member, 3));
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  REQUIRE(got->size() == 1);
  CHECK((*got)[0].byte_size() == 0);
  REQUIRE(peer_reaches(*peer, "deleted", 2 * n + 1));
  // Both read as the fetch said: by RMA when forced. Automatically, by RMA
  // where UCX reads over a native lane (cma), the first on the new
  // connection too (it waits for UCX to wire the endpoint up, when UCX
  // reports its lanes).
  const remote_import_counts done = in->node->imports_completed();
  INFO("transports " << in->node->transports());
  CHECK(done.read_by_rma + done.sent_by_exporter == 2);
  CHECK(done.without_bytes == 1);
  if (fetch == remote_fetch::rma) {
    CHECK(done.read_by_rma == 2);
  } else if (in->node->transports().find("cma") != std::string::npos) {
    CHECK(done.read_by_rma == 2);
  } else {
    CHECK(done.sent_by_exporter == 2);
  }
  REQUIRE(peer->ask("quit") == "bye " + std::to_string(2 * n + 1));
  REQUIRE(peer->wait_exit() == 0);
}

TEST_CASE("members that share memory are registered once, and a registered pool never again",
          "[remote][bundle][rma]") {
  auto out = make_importer("", 0, /*trusted=*/true);
  auto in = trusted_importer("", remote_fetch::rma);
  pool p(16, 1024);
  testing::deleter_count count;

  // Adjacent blocks, no user registration: one registration for all, one
  // key, written once in the bundle's bytes; gone with the publication.
  p.fill(1);
  remote_bundle b = publish_blocks(*out->node, p, 0, 8, count);
  REQUIRE(out->node->registrations() == 1);
  REQUIRE(out->node->registrations_made() == 1);
  const std::string key = b.members[0].descriptor.rkey;
  REQUIRE_FALSE(key.empty());
  for (const auto& m : b.members) REQUIRE(m.descriptor.rkey == key);
  // The key in the bytes once: the table's one entry is all they grow by.
  remote_bundle keyless = b;
  for (auto& m : keyless.members) m.descriptor.rkey.clear();
  REQUIRE(b.encode().size() == keyless.encode().size() + 4 + key.size());
  absl::StatusOr<std::vector<tensor>> got =
      import_bundle_now(*in->node, *remote_bundle::decode(b.encode()));
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  check_blocks(*got, p, 0, 1);
  REQUIRE(testing::eventually([&] { return count.calls.load() == 8; }));
  REQUIRE(testing::eventually([&] { return out->node->registrations() == 0; }));

  // The pool registered by its user: every publication inside it is read
  // under its key, and nothing more is registered, however often.
  absl::StatusOr<remote_registration> reg =
      out->node->register_memory(p.memory.data(), p.memory.size() * sizeof(float));
  INFO(reg.status().ToString());
  REQUIRE(reg.ok());
  REQUIRE(reg->registered());
  REQUIRE(reg->bytes() == p.memory.size() * sizeof(float));
  REQUIRE(out->node->registrations_made() == 2);
  std::string pool_key;
  for (int generation = 2; generation < 6; ++generation) {
    INFO("generation " << generation);
    p.fill(generation);
    const std::size_t first = static_cast<std::size_t>(generation) % 3;
    b = publish_blocks(*out->node, p, first, 8, count);
    if (pool_key.empty()) pool_key = b.members[0].descriptor.rkey;
    for (const auto& m : b.members) REQUIRE(m.descriptor.rkey == pool_key);
    REQUIRE(out->node->registrations() == 1);
    REQUIRE(out->node->registrations_made() == 2);
    got = import_bundle_now(*in->node, b);
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    check_blocks(*got, p, first, generation);
    REQUIRE(testing::eventually([&] { return count.calls.load() == 8 * (generation); }));
  }

  // A member outside the pool gets a registration of its own; the pool's
  // members keep the pool's key.
  std::vector<float> apart(1024, 7.0F);
  std::vector<managed_tensor> mixed;
  for (std::size_t k = 0; k < 2; ++k) {
    testing::tensor_spec spec;
    spec.shape = {p.floats};
    spec.data = k == 0 ? p.block(3) : apart.data();
    mixed.push_back(testing::make_tensor(spec, count));
  }
  absl::StatusOr<remote_bundle> m = out->node->publish_bundle(mixed);
  REQUIRE(m.ok());
  REQUIRE(m->members[0].descriptor.rkey == pool_key);
  REQUIRE_FALSE(m->members[1].descriptor.rkey.empty());
  REQUIRE(out->node->registrations() == 2);
  REQUIRE(out->node->registrations_made() == 3);

  // The handle goes while a publication under it lives: the registration
  // stays until the publication ends.
  reg->reset();
  REQUIRE_FALSE(reg->registered());
  REQUIRE(out->node->registrations() == 2);
  got = import_bundle_now(*in->node, *m);
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  REQUIRE(static_cast<const float*>((*got)[1].data())[5] == 7.0F);
  REQUIRE(testing::eventually([&] { return out->node->registrations() == 0; }));
  REQUIRE(testing::eventually([&] { return count.calls.load() == 8 * 5 + 2; }));

  // Refusals, each naming what to do.
  reg = out->node->register_memory(p.memory.data(), 4096);
  REQUIRE(reg.ok());
  absl::StatusOr<remote_registration> overlap = out->node->register_memory(p.block(0) + 512, 8192);
  REQUIRE(overlap.status().code() == absl::StatusCode::kAlreadyExists);
  REQUIRE_THAT(std::string(overlap.status().message()),
               Catch::Contains("overlap the registration"));
  REQUIRE(out->node->register_memory(nullptr, 64).status().code() ==
          absl::StatusCode::kInvalidArgument);
  REQUIRE(out->node->register_memory(p.block(8), 0).status().code() ==
          absl::StatusCode::kInvalidArgument);
  // Beside it, not over it: fine.
  absl::StatusOr<remote_registration> beside = out->node->register_memory(p.block(1), 4096);
  REQUIRE(beside.ok());
  absl::StatusOr<remote_registration> plain = in->node->register_memory(p.block(9), 64);
  REQUIRE(plain.ok());  // the importer trusts its peers too
  auto untrusted = make_importer("");
  absl::StatusOr<remote_registration> refused =
      untrusted->node->register_memory(p.memory.data(), 64);
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(refused.status().message()), Catch::Contains("trusted_peers"));

  // Moved handles let go once; shutdown unregisters what is left, and a
  // handle let go after it does nothing.
  remote_registration moved = std::move(*beside);
  REQUIRE_FALSE(beside->registered());
  REQUIRE(moved.registered());
  REQUIRE(out->node->registrations() == 2);
  out->node->shutdown();
  REQUIRE(out->node->registrations() == 0);
  REQUIRE(out->node->register_memory(p.block(12), 64).status().code() ==
          absl::StatusCode::kUnavailable);
  moved.reset();
  reg->reset();
}

TEST_CASE("a bundle keyed in part comes as pieces, or is refused under fetch = rma by member",
          "[remote][bundle][rma]") {
  auto out = make_importer("", 0, /*trusted=*/true);
  publish_options two;
  two.importers = 2;
  auto p = publish_bundle_here(
      *out->node, {{"contiguous", {8, 8}}, {"transposed", {9, 3}}, {"contiguous", {16}}}, two, 21);
  remote_bundle stripped = p->bundle;
  stripped.members[1].descriptor.rkey.clear();
  // Forced RMA: refused before any hold is taken, naming the member.
  auto rma = trusted_importer("", remote_fetch::rma);
  absl::StatusOr<std::vector<tensor>> got = import_bundle_now(*rma->node, stripped);
  require_refused(got, absl::StatusCode::kFailedPrecondition, "remote_region",
                  "bundle member 1 of 3");
  REQUIRE_THAT(std::string(got.status().message()), Catch::Contains("carries no remote key"));
  // Automatically: every member as the exporter's pieces.
  // (From 1 byte up: the mixed bundle, not its size, makes it pieces.)
  auto automatic = trusted_importer("", remote_fetch::automatic, 1);
  CHECK(rma->node->imports_completed().read_by_rma == 0);
  for (const remote_bundle& b : {stripped, p->bundle}) {
    const remote_import_counts before = automatic->node->imports_completed();
    got = import_bundle_now(*automatic->node, b);
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    if (b.members[1].descriptor.rkey.empty()) {
      // The keyless member makes the whole bundle pieces.
      CHECK(automatic->node->imports_completed().sent_by_exporter == before.sent_by_exporter + 1);
      CHECK(automatic->node->imports_completed().read_by_rma == before.read_by_rma);
    }
    check_bytes((*got)[0], "contiguous", {8, 8}, dtypes::float32, 21);
    check_bytes((*got)[1], "transposed", {9, 3}, dtypes::float32, 22);
    check_bytes((*got)[2], "contiguous", {16}, dtypes::float32, 23);
  }
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 3; }));
  REQUIRE(testing::eventually([&] { return out->node->registrations() == 0; }));
}

TEST_CASE("the key cache lets the least recently used key go", "[remote][rma]") {
  remote_detail::recent_map<int> keys(3);
  keys.put("a", 1);
  keys.put("b", 2);
  keys.put("c", 3);
  REQUIRE(keys.find("a") != nullptr);  // a is now the most recent
  keys.put("d", 4);                    // b, the least recent, goes
  CHECK(keys.size() == 3);
  CHECK(keys.find("b") == nullptr);
  REQUIRE(keys.find("a") != nullptr);
  CHECK(*keys.find("a") == 1);
  keys.put("e", 5);  // c goes: a and d were used after it
  CHECK(keys.find("c") == nullptr);
  CHECK(keys.find("d") != nullptr);
  CHECK(keys.find("e") != nullptr);
  CHECK(keys.find("a") != nullptr);
  keys.clear();
  CHECK(keys.size() == 0);
}

TEST_CASE("a bundle's keys are written once each, in order, and read back or refused",
          "[remote][bundle][descriptor]") {
  remote_bundle b;
  b.lease_id = 5;
  b.exporter_address = "10.0.0.2";
  b.exporter_port = 7000;
  b.published = 4;
  const std::vector<std::string> keys = {"key-A", "", "key-B", "key-A"};
  for (std::uint32_t i = 0; i < 4; ++i) {
    remote_bundle::member m;
    m.index = i;
    m.descriptor.shape = {4};
    m.descriptor.strides = {1};
    m.descriptor.data = 4096 * (i + 1);
    m.descriptor.region_begin = m.descriptor.data;
    m.descriptor.region_bytes = 16;
    m.descriptor.rkey = keys[i];
    b.members.push_back(m);
  }
  const std::string bytes = b.encode();
  REQUIRE(occurrences(bytes, "key-A") == 1);
  REQUIRE(occurrences(bytes, "key-B") == 1);
  absl::StatusOr<remote_bundle> back = remote_bundle::decode(bytes);
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  for (std::size_t i = 0; i < 4; ++i) REQUIRE(back->members[i].descriptor.rkey == keys[i]);
  REQUIRE(back->encode() == bytes);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    REQUIRE_FALSE(remote_bundle::decode(std::string_view(bytes).substr(0, n)).ok());
  }
  // The key table: count, then each key with its length.
  const std::size_t table = 4 + 2 + 2 + 8 + (4 + 4 + 2) + 4 + 4;
  auto with = [&](std::size_t at, const std::string& what) {
    std::string out = bytes;
    out.replace(at, what.size(), what);
    return remote_bundle::decode(out).status();
  };
  // Keys named out of order, a key named by nobody, one name past the
  // keys, a repeated key, an empty one: each refused by name.
  const std::size_t first_member = table + 4 + (4 + 5) + (4 + 5);
  const std::size_t member_bytes = 4 + 4 + 64 + 16;
  absl::Status s = with(first_member + 4, std::string("\x01\x00\x00\x00", 4));
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(s.message()),
               Catch::Contains("members name the bundle's keys in order"));
  s = with(first_member + 2 * member_bytes + 4, std::string("\xff\xff\xff\xff", 4));
  REQUIRE_THAT(std::string(s.message()), Catch::Contains("is named by no member"));
  s = with(first_member + 4, std::string("\x07\x00\x00\x00", 4));
  REQUIRE_THAT(std::string(s.message()), Catch::Contains("key 7 of 2"));
  s = with(table + 4 + 4 + 5 + 4, "key-A");
  REQUIRE_THAT(std::string(s.message()), Catch::Contains("remote key 1 repeats key 0"));
  s = with(table + 4, std::string("\x00\x00\x00\x00", 4));
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(s.message()), Catch::Contains("remote key 0 is empty"));
  remote_bundle long_key = b;
  long_key.members[0].descriptor.rkey.assign(remote_bundle::max_key_bytes + 1, 'k');
  REQUIRE(remote_bundle::decode(long_key.encode()).status().code() ==
          absl::StatusCode::kOutOfRange);
}

}  // namespace dlasync
