// The inference server's inputs named in a remote bundle
// (remote_inputs.hpp): an exporter node in this process publishes, the
// server's message handler fetches, and every producer is counted.
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "buffer_pool.hpp"
#include "catch2/catch.hpp"
#include "dlasync/producer.hpp"
#include "dlasync/remote.hpp"
#include "host_models.hpp"
#include "kserve_requests.hpp"
#include "kserve_service.hpp"
#include "remote_inputs.hpp"
#include "shm_registry.hpp"
#include "support/runtime_fixture.hpp"
#include "support/test_tensors.hpp"

namespace dlasync::examples::kserve {
namespace {

using dlasync::testing::require_status;

// A node of its own runtime that publishes bundles, counting every
// producer it releases.
struct exporter {
  exporter() : rt(testing::make_runtime(1)) {
    absl::StatusOr<std::unique_ptr<remote_node>> n = remote_node::create(*rt);
    REQUIRE(n.ok());
    node = *std::move(n);
  }
  ~exporter() {
    node->shutdown();
    rt->shutdown();
  }
  exporter(const exporter&) = delete;
  exporter& operator=(const exporter&) = delete;

  // Members: 0, FP32 [2,3], strided (the transpose of a 3x2 array); 1,
  // INT64 [4]; 2, FP32 [5]. The encoded bundle, in base64.
  std::string publish(std::chrono::milliseconds lease = std::chrono::seconds(30)) {
    auto floats = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
    auto ints =
        std::make_shared<std::vector<std::int64_t>>(std::vector<std::int64_t>{-7, 0, 1LL << 40, 9});
    auto five = std::make_shared<std::vector<float>>(5, 0.5F);
    const auto count = [this](auto owner) { return [this, owner] { released.fetch_add(1); }; };
    std::vector<managed_tensor> sources;
    sources.push_back(make_managed_tensor(
        {.data = floats->data(), .shape = {2, 3}, .strides = std::vector<std::int64_t>{1, 2}},
        count(floats)));
    sources.push_back(make_managed_tensor(
        {.data = ints->data(), .dtype = dtypes::int64, .shape = {4}}, count(ints)));
    sources.push_back(make_managed_tensor({.data = five->data(), .shape = {5}}, count(five)));
    publish_options po;
    po.lease = lease;
    absl::StatusOr<remote_bundle> b = node->publish_bundle(sources, po);
    REQUIRE(b.ok());
    published += 3;
    return absl::Base64Escape(b->encode());
  }

  // Waits until every producer published has been released.
  bool all_released() const {
    for (int i = 0; i < 500 && released.load() != published; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return released.load() == published;
  }

  std::unique_ptr<runtime> rt;
  std::unique_ptr<remote_node> node;
  int published = 0;
  std::atomic<int> released{0};
};

// An echo request whose inputs name the members `m0` and `m1` of `bundle`
// (base64), INPUT0 as FP32 `shape0`, INPUT1 as INT64 [4].
inference::ModelInferRequest echo_request(const std::string& bundle, std::int64_t m0,
                                          std::int64_t m1,
                                          const std::vector<std::int64_t>& shape0 = {2, 3}) {
  inference::ModelInferRequest r;
  r.set_model_name("echo");
  if (!bundle.empty()) (*r.mutable_parameters())["dlasync_bundle"].set_string_param(bundle);
  auto* in0 = r.add_inputs();
  in0->set_name("INPUT0");
  in0->set_datatype("FP32");
  for (const std::int64_t e : shape0) in0->add_shape(e);
  (*in0->mutable_parameters())["dlasync_bundle_member"].set_int64_param(m0);
  auto* in1 = r.add_inputs();
  in1->set_name("INPUT1");
  in1->set_datatype("INT64");
  in1->add_shape(4);
  (*in1->mutable_parameters())["dlasync_bundle_member"].set_int64_param(m1);
  return r;
}

TEST_CASE("a request's inputs come as one remote bundle, from the host that sent it",
          "[examples][kserve][remote]") {
  // Made before the runtimes, so that they outlive every deleter.
  const shm_registry shm(false);
  memory_budget budget(8 << 20);
  buffer_pool pool(0);
  exporter ex;
  host_models host;
  remote_inputs::options ro;
  ro.timeout = std::chrono::seconds(5);
  absl::StatusOr<std::unique_ptr<remote_inputs>> fetcher = remote_inputs::create(*host.rt, ro);
  REQUIRE(fetcher.ok());
  const message_server server{*host.models, shm, budget, pool, fetcher->get()};
  const auto answer = [&](const inference::ModelInferRequest& m, const message_server& s,
                          std::string peer = "127.0.0.1") {
    const std::vector<std::byte> bytes = serialize(m);
    REQUIRE(budget.try_acquire(bytes.size()));
    std::shared_ptr<void> room(nullptr, [&, n = bytes.size()](void*) { budget.release(n); });
    auto copy = std::make_unique<std::byte[]>(bytes.size());
    std::memcpy(copy.get(), bytes.data(), bytes.size());
    serialized_message sm = serialized_message::of(std::move(copy), bytes.size());
    sm.peer = std::move(peer);
    return host.run(s.answer_serialized(std::move(sm), std::move(room)));
  };

  SECTION("the members the inputs name are fetched, byte for byte, and every producer released") {
    const absl::StatusOr<std::string> r = answer(echo_request(ex.publish(), 0, 1), server);
    REQUIRE(r.ok());
    inference::ModelInferResponse response;
    REQUIRE(response.ParseFromString(*r));
    REQUIRE(response.raw_output_contents_size() == 2);
    // The transpose of [[1,2],[3,4],[5,6]], compact.
    std::vector<float> out0(6);
    REQUIRE(response.raw_output_contents(0).size() == sizeof(float) * 6);
    std::memcpy(out0.data(), response.raw_output_contents(0).data(), sizeof(float) * 6);
    CHECK(out0 == std::vector<float>{1, 3, 5, 2, 4, 6});
    std::vector<std::int64_t> out1(4);
    REQUIRE(response.raw_output_contents(1).size() == sizeof(std::int64_t) * 4);
    std::memcpy(out1.data(), response.raw_output_contents(1).data(), sizeof(std::int64_t) * 4);
    CHECK(out1 == std::vector<std::int64_t>{-7, 0, 1LL << 40, 9});
    // One hold for the two members named; its release ends the lease, and
    // all three producers go.
    CHECK(ex.all_released());
  }
  SECTION("an exporter other than the sender's host is never contacted") {
    require_status(answer(echo_request(ex.publish(), 0, 1), server, "10.9.8.7").status(),
                   absl::StatusCode::kPermissionDenied,
                   {"names an exporter at 127.0.0.1, not the host the request came from "
                    "(10.9.8.7)"});
    require_status(answer(echo_request(ex.publish(), 0, 1), server, "").status(),
                   absl::StatusCode::kPermissionDenied, {"(unknown)"});
  }
  SECTION(
      "a port of the sender's host below 1024, or outside the range given, is never contacted") {
    // Before: any port of the sender's host, so a request could make the
    // server open a connection to the sender's ssh or http service.
    const auto with_port = [](const std::string& encoded, std::uint16_t port) {
      std::string bytes;
      REQUIRE(absl::Base64Unescape(encoded, &bytes));
      absl::StatusOr<remote_bundle> b = remote_bundle::decode(bytes);
      REQUIRE(b.ok());
      b->exporter_port = port;
      for (remote_bundle::member& m : b->members) m.descriptor.exporter_port = port;
      return absl::Base64Escape(b->encode());
    };
    const std::string b = ex.publish();
    require_status(answer(echo_request(with_port(b, 22), 0, 1), server).status(),
                   absl::StatusCode::kPermissionDenied,
                   {"names an exporter at port 22 of its host, outside the ports this server "
                    "fetches from (1024-65535, --remote_input_ports)"});
    // A range that leaves the exporter's port out (on a runtime of its
    // own: a runtime has one node; the refusal comes before it is used).
    const std::unique_ptr<runtime> other = testing::make_runtime(1);
    remote_inputs::options narrow = ro;
    narrow.min_port = 1;
    narrow.max_port = 1023;
    absl::StatusOr<std::unique_ptr<remote_inputs>> strict = remote_inputs::create(*other, narrow);
    REQUIRE(strict.ok());
    const message_server guarded{*host.models, shm, budget, pool, strict->get()};
    require_status(answer(echo_request(b, 0, 1), guarded).status(),
                   absl::StatusCode::kPermissionDenied, {"(1-1023, --remote_input_ports)"});
    (*strict)->shutdown();
    // Refused before any hold: the bundle is still whole.
    REQUIRE(answer(echo_request(b, 0, 1), server).ok());
    CHECK(ex.all_released());
    narrow.min_port = 2000;
    narrow.max_port = 1000;
    REQUIRE(remote_inputs::create(*other, narrow).status().code() ==
            absl::StatusCode::kInvalidArgument);
  }
  SECTION("members past the bundle, named twice, or not as the input says") {
    const std::string b = ex.publish();
    require_status(answer(echo_request(b, 5, 1), server).status(), absl::StatusCode::kOutOfRange,
                   {"input INPUT0 names member 5 of the request's bundle, which has 3"});
    require_status(answer(echo_request(b, 0, 0), server).status(),
                   absl::StatusCode::kInvalidArgument,
                   {"input INPUT1 names member 0 of the request's bundle, which input INPUT0 "
                    "names too"});
    require_status(answer(echo_request(b, 0, 2), server).status(),
                   absl::StatusCode::kInvalidArgument,
                   {"input INPUT1 is INT64 [4]; member 2 of the request's bundle is FP32 [5]"});
    require_status(answer(echo_request(b, 0, 1, {3, 2}), server).status(),
                   absl::StatusCode::kInvalidArgument,
                   {"input INPUT0 is FP32 [3,2]; member 0 of the request's bundle is FP32 [2,3]"});
    // Refused before any hold: the same bundle is still whole.
    REQUIRE(answer(echo_request(b, 0, 1), server).ok());
  }
  SECTION("a bundle parameter that is no bundle") {
    require_status(answer(echo_request("not base64!", 0, 1), server).status(),
                   absl::StatusCode::kInvalidArgument,
                   {"dlasync_bundle of the request is not an encoded dlasync::remote_bundle"});
    require_status(answer(echo_request(absl::Base64Escape("DLRB garbage"), 0, 1), server).status(),
                   absl::StatusCode::kInvalidArgument, {"the request's dlasync_bundle: "});
    inference::ModelInferRequest m = echo_request("", 0, 1);
    require_status(answer(m, server).status(), absl::StatusCode::kInvalidArgument,
                   {"input INPUT0 names member 0 of a remote bundle, but the request has no "
                    "dlasync_bundle parameter"});
    m = echo_request(ex.publish(), 0, 1);
    m.mutable_inputs(1)->mutable_contents()->add_int64_contents(1);
    require_status(answer(m, server).status(), absl::StatusCode::kInvalidArgument,
                   {"input INPUT1 gives its bytes more than one way: dlasync_bundle_member and "
                    "contents"});
  }
  SECTION("a server that does not fetch bundles refuses them") {
    const message_server plain{*host.models, shm, budget, pool};
    require_status(answer(echo_request(ex.publish(), 0, 1), plain).status(),
                   absl::StatusCode::kPermissionDenied, {"--allow_remote_inputs"});
  }
  SECTION("a bundle whose lease has ended") {
    const std::string b = ex.publish(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    require_status(answer(echo_request(b, 0, 1), server).status(), absl::StatusCode::kNotFound,
                   {"the request's bundle (lease ", "at 127.0.0.1:"});
    CHECK(ex.all_released());
  }
  (*fetcher)->shutdown();
  // Every bundle refused before its hold ends with the exporter; every
  // producer is released once.
  ex.node->shutdown();
  CHECK(ex.released.load() == ex.published);
  CHECK(budget.in_use() == 0);
}

}  // namespace
}  // namespace dlasync::examples::kserve
