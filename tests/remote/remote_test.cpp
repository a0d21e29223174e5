// Remote imports over UCX between two processes on this machine (the peer
// is tests/remote/remote_peer.cpp), over shared memory and over TCP on
// loopback, and the node's contract within one process. Every wait is
// bounded; every producer deleter is counted.
#include "dlasync/remote.hpp"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
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
#include "remote/remote_fixture.hpp"
#include "remote/remote_support.hpp"
#include "support/copy_budget.hpp"
#include "support/runtime_fixture.hpp"
#include "support/sim_runtime.hpp"
#include "support/test_tensors.hpp"

namespace dlasync {
namespace {

using namespace std::chrono_literals;
using testing::peer_process;

std::vector<std::int64_t> shape_for(const std::string& layout, const dtype& type) {
  if (layout == "wide_rows") return {4, static_cast<std::int64_t>(32768 / type.padded_size())};
  return {6, 5, 3};
}

const std::vector<dtype>& all_dtypes() {
  static const std::vector<dtype> all = {
      dtypes::int8,       dtypes::int16,      dtypes::int32,   dtypes::int64,
      dtypes::uint8,      dtypes::uint16,     dtypes::uint32,  dtypes::uint64,
      dtypes::float16,    dtypes::float32,    dtypes::float64, dtypes::bfloat16,
      dtypes::complex64,  dtypes::complex128, dtypes::bool8,   dtypes::float8_e4m3fn,
      dtypes::float8_e5m2};
  return all;
}

}  // namespace

TEST_CASE("every dtype and layout crosses from another process intact", "[remote][ucx]") {
  const std::string transports = GENERATE(std::string("shm"), std::string("tcp"));
  INFO("transports " << transports);
  auto peer = start_peer(transports);
  auto in = make_importer(transports);
  int published = 0;
  unsigned seed = 0;
  for (const dtype& type : all_dtypes()) {
    for (const std::string& layout : testing::layouts()) {
      ++seed;
      const std::vector<std::int64_t> shape = shape_for(layout, type);
      INFO(type.name() << " " << layout << " " << testing::shape_text(shape));
      remote_descriptor d = descriptor_from(peer->ask("publish " + dtype_arg(type) + " " + layout +
                                                      " " + testing::shape_text(shape) +
                                                      " 1 20000 " + std::to_string(seed)));
      ++published;
      absl::StatusOr<tensor> t = import_now(*in->node, d);
      INFO(t.status().ToString());
      REQUIRE(t.ok());
      check_bytes(*t, layout, shape, type, seed);
      REQUIRE(t->device() == host_device);
    }
  }
  // A 0-d tensor, a size-0 tensor, and packed 4-bit floats.
  for (const auto& [type, shape] : std::vector<std::pair<dtype, std::string>>{
           {dtypes::float64, "scalar"}, {dtypes::int32, "4x0x3"}, {dtypes::float4_e2m1fn, "8x6"}}) {
    ++seed;
    remote_descriptor d = descriptor_from(peer->ask("publish " + dtype_arg(type) + " contiguous " +
                                                    shape + " 1 20000 " + std::to_string(seed)));
    ++published;
    absl::StatusOr<tensor> t = import_now(*in->node, d);
    INFO(type.name() << " " << shape << ": " << t.status().ToString());
    REQUIRE(t.ok());
    REQUIRE(std::vector<std::int64_t>(t->shape().begin(), t->shape().end()) ==
            testing::parse_shape(shape));
    // Packed or not, the compact bytes are the pattern's.
    const std::optional<std::uint64_t> bad = testing::first_mismatch(
        static_cast<const unsigned char*>(t->data()), t->byte_size(), "contiguous", {}, 1, seed);
    REQUIRE_FALSE(bad.has_value());
  }
  // Each producer was released once, when its importer let go of the hold.
  REQUIRE(peer_reaches(*peer, "deleted", published));
  REQUIRE(peer_count(*peer, "publications") == 0);
  // The copies here were dropped, and gave their budget back.
  REQUIRE(testing::copy_budget(*in->rt).in_use() == 0);
  REQUIRE(peer->ask("quit") == "bye " + std::to_string(published));
  REQUIRE(peer->wait_exit() == 0);
}

TEST_CASE("a 256 MiB tensor crosses from another process intact", "[remote][ucx][large]") {
  const std::string transports = GENERATE(std::string("shm"), std::string("tcp"));
  INFO("transports " << transports);
  auto peer = start_peer(transports);
  auto in = make_importer(transports);
  remote_descriptor d = descriptor_from(
      peer->ask("publish " + dtype_arg(dtypes::float32) + " contiguous 8192x8192 1 60000 7"));
  absl::StatusOr<tensor> t = import_now(*in->node, d);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  REQUIRE(t->byte_size() == 256ull << 20);
  check_bytes(*t, "contiguous", {8192, 8192}, dtypes::float32, 7);
  REQUIRE(testing::copy_budget(*in->rt).in_use() == 256ull << 20);
  *t = tensor();
  REQUIRE(testing::copy_budget(*in->rt).in_use() == 0);
  REQUIRE(peer_reaches(*peer, "deleted", 1));
}

TEST_CASE("1,000 concurrent remote imports all arrive, and every producer is released once",
          "[remote][ucx]") {
  const std::string transports = GENERATE(std::string("shm"), std::string("tcp"));
  INFO("transports " << transports);
  auto peer = start_peer(transports);
  auto in = make_importer(transports);
  constexpr int n = 1000;
  peer->send("publish_many " + std::to_string(n) + " " + dtype_arg(dtypes::float32) +
             " transposed 16x12 60000");
  std::vector<remote_descriptor> descriptors;
  for (int i = 0; i < n; ++i) descriptors.push_back(descriptor_from(peer->read_line()));
  std::atomic<int> ok{0};
  std::atomic<int> done{0};
  std::atomic<int> wrong{0};
  for (int i = 0; i < n; ++i) {
    async_import_remote(
        *in->node, descriptors[static_cast<std::size_t>(i)], {}, [&, i](absl::StatusOr<tensor> t) {
          if (t.ok()) {
            ok.fetch_add(1);
            if (testing::first_mismatch(static_cast<const unsigned char*>(t->data()),
                                        t->byte_size(), "transposed", {16, 12}, 4,
                                        static_cast<unsigned>(i))) {
              wrong.fetch_add(1);
            }
          }
          done.fetch_add(1);
        });
  }
  REQUIRE(testing::eventually([&] { return done.load() == n; }));
  REQUIRE(ok.load() == n);
  REQUIRE(wrong.load() == 0);
  REQUIRE(peer_reaches(*peer, "deleted", n));
  REQUIRE(in->node->imports_in_flight() == 0);
  REQUIRE(testing::eventually([&] { return testing::copy_budget(*in->rt).in_use() == 0; }));
}

TEST_CASE("a cancelled remote import ends with Cancelled, frees its memory and releases its hold",
          "[remote][ucx]") {
  auto peer = start_peer("tcp");
  auto in = make_importer("tcp");
  canceller cancel;
  int published = 0;
  int cancelled = 0;
  for (int delay_us : {0, 200, 2000, 20000, 100000}) {
    INFO("cancelled after " << delay_us << " us");
    remote_descriptor d = descriptor_from(
        peer->ask("publish " + dtype_arg(dtypes::float32) + " contiguous 4096x4096 1 5000 3"));
    ++published;
    absl::StatusOr<tensor> t = cancel.cancelled_after<tensor>(
        std::chrono::microseconds(delay_us),
        [&](auto token) { async_import_remote(*in->node, d, {}, std::move(token)); });
    // Either the bytes had all arrived, or the import stopped.
    if (!t.ok()) {
      ++cancelled;
      REQUIRE(t.status().code() == absl::StatusCode::kCancelled);
    }
  }
  REQUIRE(cancelled > 0);
  // Every hold is released (or its lease ends), every producer freed once.
  REQUIRE(peer_reaches(*peer, "deleted", published));
  REQUIRE(testing::eventually([&] { return testing::copy_budget(*in->rt).in_use() == 0; }));
  REQUIRE(testing::eventually([&] { return in->node->imports_in_flight() == 0; }));
}

TEST_CASE("an exporter killed during the transfer gives the importer a clear error, not a hang",
          "[remote][ucx]") {
  SECTION("over TCP, which reports the lost peer: Unavailable") {
    auto in = make_importer("tcp");
    int errors = 0;
    for (int delay_ms : {0, 5, 40, 120}) {
      INFO("killed after " << delay_ms << " ms");
      auto peer = start_peer("tcp");
      remote_descriptor d = descriptor_from(
          peer->ask("publish " + dtype_arg(dtypes::float32) + " contiguous 8192x8192 1 60000 5"));
      std::future<absl::StatusOr<tensor>> f =
          async_import_remote(*in->node, d, {}, asio::use_future);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      peer->kill_now();
      REQUIRE(f.wait_for(40s) == std::future_status::ready);
      absl::StatusOr<tensor> t = f.get();
      if (!t.ok()) {
        ++errors;
        INFO(t.status().ToString());
        REQUIRE(t.status().code() == absl::StatusCode::kUnavailable);
        REQUIRE_THAT(std::string(t.status().message()), Catch::Contains("exporter"));
      }
    }
    REQUIRE(errors > 0);
    REQUIRE(testing::eventually([&] { return testing::copy_budget(*in->rt).in_use() == 0; }));
    REQUIRE(testing::eventually([&] { return in->node->imports_in_flight() == 0; }));
  }
  SECTION("over shared memory alone, which cannot: import_timeout bounds it") {
    auto in = std::make_unique<importer>();
    in->rt = testing::make_runtime(2);
    remote_node_options o;
    o.transports = "shm";
    o.import_timeout = 2s;
    in->node = *remote_node::create(*in->rt, o);
    auto peer = start_peer("shm");
    remote_descriptor d = descriptor_from(
        peer->ask("publish " + dtype_arg(dtypes::float32) + " contiguous 64x64 1 60000 5"));
    peer->kill_now();
    std::future<absl::StatusOr<tensor>> f = async_import_remote(*in->node, d, {}, asio::use_future);
    REQUIRE(f.wait_for(40s) == std::future_status::ready);
    absl::StatusOr<tensor> t = f.get();
    INFO(t.status().ToString());
    REQUIRE_FALSE(t.ok());
    REQUIRE((t.status().code() == absl::StatusCode::kDeadlineExceeded ||
             t.status().code() == absl::StatusCode::kUnavailable));
    REQUIRE(testing::eventually([&] { return testing::copy_budget(*in->rt).in_use() == 0; }));
  }
}

TEST_CASE("an importer killed while it holds a lease: the lease ends and the deleter runs once",
          "[remote][ucx]") {
  auto out = make_importer("tcp");
  publish_options o;
  o.lease = 1500ms;
  auto p = publish_here(*out->node, "contiguous", {8192, 4096}, o);
  auto peer = start_peer("tcp");
  peer->send("import " + testing::to_hex(p->descriptor.encode()));
  REQUIRE(peer->read_line() == "started");
  std::this_thread::sleep_for(20ms);
  peer->kill_now();
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
  REQUIRE(out->node->publications() == 0);
  std::this_thread::sleep_for(200ms);
  REQUIRE(p->count.calls.load() == 1);
}

TEST_CASE("a remote descriptor is validated before anything moves, and nothing is consumed",
          "[remote][validation]") {
  node_pair nodes;
  auto p = publish_here(nodes.out(), "contiguous", {8, 4});
  const remote_descriptor good = p->descriptor;

  SECTION("framing: magic, truncation, trailing bytes, ndim") {
    const std::string bytes = good.encode();
    absl::StatusOr<remote_descriptor> r = remote_descriptor::decode("XXXX" + bytes.substr(4));
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(r.status().message()), Catch::Contains("DLRD"));
    for (std::size_t cut : {std::size_t{5}, std::size_t{20}, bytes.size() - 1}) {
      r = remote_descriptor::decode(bytes.substr(0, cut));
      REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
      REQUIRE_THAT(std::string(r.status().message()), Catch::Contains("cut short"));
    }
    std::string reserved = bytes;
    reserved[6] = 1;
    r = remote_descriptor::decode(reserved);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(r.status().message()), Catch::Contains("reserved"));
    r = remote_descriptor::decode(bytes + "x");
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(r.status().message()), Catch::Contains("1 bytes after its end"));
    remote_descriptor deep = good;
    deep.shape.assign(65, 1);
    deep.strides.assign(65, 1);
    r = remote_descriptor::decode(deep.encode());
    REQUIRE(r.status().code() == absl::StatusCode::kOutOfRange);
    REQUIRE_THAT(std::string(r.status().message()), Catch::Contains("ndim 65"));
    REQUIRE(remote_descriptor::decode(bytes).ok());
  }
  SECTION("a span outside the registered region") {
    remote_descriptor d = good;
    d.region_bytes -= 4;
    require_refused(import_now(nodes.in(), d), absl::StatusCode::kInvalidArgument, "remote_region",
                    "outside the region");
    // A region that ends before the span begins (a wrap the fuzzer found).
    d = good;
    d.region_begin = good.region_begin - 4096;
    d.region_bytes = 16;
    require_refused(import_now(nodes.in(), d), absl::StatusCode::kInvalidArgument, "remote_region",
                    "outside the region");
    d = good;
    d.shape[0] = 1'000'000;
    require_refused(import_now(nodes.in(), d), absl::StatusCode::kInvalidArgument, "remote_region",
                    "outside the region");
  }
  SECTION("the local rules: shape, dtype, strides, version") {
    remote_descriptor d = good;
    d.shape[1] = -1;
    absl::StatusOr<tensor> t = import_now(nodes.in(), d);
    REQUIRE(t.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(import_error_of(t.status())->rule == "shape");
    d = good;
    d.type = dtype{0, 7, 1};
    t = import_now(nodes.in(), d);
    REQUIRE_FALSE(t.ok());
    REQUIRE(import_error_of(t.status())->rule == "dtype");
    d = good;
    d.strides = {std::int64_t{1} << 62, 1};
    t = import_now(nodes.in(), d);
    REQUIRE_FALSE(t.ok());
    REQUIRE_FALSE(import_error_of(t.status())->consumed);
    d = good;
    d.dlpack_major = 2;
    require_refused(import_now(nodes.in(), d), absl::StatusCode::kUnimplemented, "version",
                    "DLPack 2.");
  }
  SECTION("options a remote import cannot honour, and a GPU of the exporter") {
    import_options o;
    o.copy = false;
    require_refused(import_now(nodes.in(), good, o), absl::StatusCode::kFailedPrecondition, "copy",
                    "always move");
    o = {};
    o.stream = 5;
    require_refused(import_now(nodes.in(), good, o), absl::StatusCode::kInvalidArgument, "stream",
                    "stream=5");
    remote_descriptor d = good;
    d.source_device = device{device_kind::cuda, 1};
    require_refused(import_now(nodes.in(), d), absl::StatusCode::kUnimplemented, "source_device",
                    "cuda:1");
  }
  SECTION("a tensor larger than the whole copy budget") {
    auto small = make_importer("", 64);
    require_refused(import_now(*small->node, good), absl::StatusCode::kResourceExhausted, "budget",
                    "more than the whole copy memory budget of 64 bytes");
  }
  // Nothing was consumed: the publication is still there, and imports.
  REQUIRE(p->count.calls.load() == 0);
  REQUIRE(nodes.out().publications() == 1);
  absl::StatusOr<tensor> t = import_now(nodes.in(), good);
  REQUIRE(t.ok());
  check_bytes(*t, "contiguous", {8, 4}, dtypes::float32, 1);
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
}

TEST_CASE("a lease serves its importers, then refuses, and ends on time", "[remote][lease]") {
  node_pair nodes;
  SECTION("two importers: the deleter runs after the second releases") {
    publish_options o;
    o.importers = 2;
    auto p = publish_here(nodes.out(), "every_other_row", {10, 7}, o);
    REQUIRE(import_now(nodes.in(), p->descriptor).ok());
    std::this_thread::sleep_for(50ms);
    REQUIRE(p->count.calls.load() == 0);
    absl::StatusOr<tensor> t = import_now(nodes.in(), p->descriptor);
    REQUIRE(t.ok());
    check_bytes(*t, "every_other_row", {10, 7}, dtypes::float32, 1);
    REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
    require_refused(import_now(nodes.in(), p->descriptor), absl::StatusCode::kNotFound, "lease",
                    "is not published here");
  }
  SECTION("a lease that ends releases the producer, and later imports are refused") {
    publish_options o;
    o.lease = 100ms;
    auto p = publish_here(nodes.out(), "contiguous", {4, 4}, o);
    REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
    REQUIRE(nodes.out().publications() == 0);
    require_refused(import_now(nodes.in(), p->descriptor), absl::StatusCode::kNotFound, "lease",
                    "expired");
  }
  SECTION("a publication that is never imported is released at shutdown") {
    auto a = publish_here(nodes.out(), "contiguous", {4, 4});
    auto b = publish_here(nodes.out(), "negative", {4, 4});
    REQUIRE(nodes.out().publications() == 2);
    nodes.out().shutdown();
    REQUIRE(a->count.calls.load() == 1);
    REQUIRE(b->count.calls.load() == 1);
    // The exporter's worker is gone: the importer hears so at once.
    require_refused(import_now(nodes.in(), a->descriptor), absl::StatusCode::kUnavailable, "",
                    "exporter");
  }
  SECTION("shutdown returns after the deleters of publications that ended before it") {
    // Before: a publication whose last hold was released had its deleter
    // posted to the executor, and shutdown did not wait for it.
    auto memory = std::make_shared<testing::laid_out>(testing::lay_out("contiguous", {64}, 4, 1));
    auto entered = std::make_shared<std::atomic<bool>>(false);
    auto deleted = std::make_shared<std::atomic<int>>(0);
    std::promise<void> go;
    std::shared_future<void> may_end = go.get_future().share();
    tensor_description d;
    d.data = memory->data();
    d.dtype = dtypes::float32;
    d.shape = memory->shape;
    d.strides = memory->strides;
    managed_tensor t = make_managed_tensor(std::move(d), [memory, entered, deleted, may_end] {
      entered->store(true);
      may_end.wait();
      deleted->fetch_add(1);
    });
    absl::StatusOr<remote_descriptor> r = nodes.out().publish(t);
    REQUIRE(r.ok());
    REQUIRE(import_now(nodes.in(), *r).ok());
    // The release ended the publication: its deleter runs on the executor.
    REQUIRE(testing::eventually([&] { return entered->load(); }));
    std::thread opener([&go] {
      std::this_thread::sleep_for(300ms);
      go.set_value();
    });
    nodes.out().shutdown();
    CHECK(deleted->load() == 1);
    opener.join();
  }
}

TEST_CASE("a publication's end is told once to each callback, with why it ended",
          "[remote][lease]") {
  node_pair nodes;
  struct told {
    std::mutex mutex;
    std::vector<publication_end> why;
  };
  auto seen = std::make_shared<told>();
  auto record = [seen](publication_end why) {
    std::lock_guard lock(seen->mutex);
    seen->why.push_back(why);
  };
  auto ends = [seen] {
    std::lock_guard lock(seen->mutex);
    return seen->why;
  };
  using ended = std::vector<publication_end>;
  SECTION("its importers released it") {
    publish_options o;
    o.importers = 2;
    auto p = publish_here(nodes.out(), "contiguous", {16}, o);
    const std::uint64_t lease = p->descriptor.lease_id;
    REQUIRE(nodes.out().when_ended(lease, record).ok());
    REQUIRE(nodes.out().when_ended(lease, record).ok());
    REQUIRE(import_now(nodes.in(), p->descriptor).ok());
    std::this_thread::sleep_for(50ms);
    REQUIRE(ends().empty());
    REQUIRE(import_now(nodes.in(), p->descriptor).ok());
    REQUIRE(testing::eventually([&] { return ends().size() == 2; }));
    REQUIRE(ends() == ended{publication_end::released, publication_end::released});
    REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
    // Its end has passed: a callback given now is refused, and never called.
    absl::Status late = nodes.out().when_ended(lease, record);
    REQUIRE(late.code() == absl::StatusCode::kNotFound);
    REQUIRE_THAT(std::string(late.message()), Catch::Contains("its end has passed"));
    std::this_thread::sleep_for(50ms);
    REQUIRE(ends().size() == 2);
  }
  SECTION("its lease ended") {
    publish_options o;
    o.lease = 500ms;
    auto p = publish_here(nodes.out(), "contiguous", {16}, o);
    REQUIRE(nodes.out().when_ended(p->descriptor.lease_id, record).ok());
    REQUIRE(testing::eventually([&] { return !ends().empty(); }));
    REQUIRE(ends() == ended{publication_end::expired});
    REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
  }
  SECTION("the node shut down: told before shutdown returns") {
    auto p = publish_here(nodes.out(), "contiguous", {16});
    REQUIRE(nodes.out().when_ended(p->descriptor.lease_id, record).ok());
    nodes.out().shutdown();
    REQUIRE(ends() == ended{publication_end::shutdown});
    REQUIRE(p->count.calls.load() == 1);
    REQUIRE(nodes.out().when_ended(p->descriptor.lease_id, record).code() ==
            absl::StatusCode::kNotFound);
  }
  SECTION("two callers at once: each returns once the end is told, and a callback may call it") {
    auto p = publish_here(nodes.out(), "contiguous", {16});
    remote_node& out = nodes.out();
    // The callback is slow, and shuts the node down itself (a no-op there).
    REQUIRE(out.when_ended(p->descriptor.lease_id,
                           [record, &out](publication_end why) {
                             std::this_thread::sleep_for(200ms);
                             out.shutdown();
                             record(why);
                           })
                .ok());
    std::atomic<std::size_t> told_first{99};
    std::atomic<std::size_t> told_second{99};
    std::thread first([&] {
      out.shutdown();
      told_first = ends().size();
    });
    const bool retired = testing::eventually([&] { return out.publications() == 0; });
    std::thread second([&] {
      out.shutdown();
      told_second = ends().size();
    });
    first.join();
    second.join();
    REQUIRE(retired);
    REQUIRE(told_first.load() == 1);
    REQUIRE(told_second.load() == 1);
    REQUIRE(p->count.calls.load() == 1);
  }
  SECTION("a bundle's lease, an unknown lease, an empty callback") {
    auto b = publish_bundle_here(nodes.out(), {{"contiguous", {8}}, {"negative", {3, 5}}});
    REQUIRE(nodes.out().when_ended(b->bundle.lease_id, record).ok());
    REQUIRE(import_bundle_now(nodes.in(), b->bundle).ok());
    REQUIRE(testing::eventually([&] { return ends() == ended{publication_end::released}; }));
    REQUIRE(nodes.out().when_ended(b->bundle.lease_id + 1, record).code() ==
            absl::StatusCode::kNotFound);
    auto p = publish_here(nodes.out(), "contiguous", {16});
    absl::Status empty = nodes.out().when_ended(p->descriptor.lease_id, {});
    REQUIRE(empty.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(empty.message()), Catch::Contains("empty callback"));
    nodes.out().shutdown();  // `p` is released before its counter goes
  }
}

TEST_CASE("publish refuses what it cannot export, and the caller keeps the tensor",
          "[remote][publish]") {
  node_pair nodes;
  testing::deleter_count count;
  std::vector<float> data(16);
  testing::tensor_spec spec;
  spec.shape = {4, 4};
  spec.data = data.data();
  managed_tensor t = testing::make_tensor(spec, count);
  publish_options o;
  o.importers = 0;
  absl::StatusOr<remote_descriptor> d = nodes.out().publish(t, o);
  REQUIRE(d.status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_THAT(std::string(d.status().message()), Catch::Contains("importers = 0"));
  REQUIRE_FALSE(t.empty());
  o = {};
  o.lease = 0ms;
  REQUIRE(nodes.out().publish(t, o).status().code() == absl::StatusCode::kInvalidArgument);
  spec.shape = {-1, 4};
  managed_tensor bad = testing::make_tensor(spec, count);
  REQUIRE(nodes.out().publish(bad).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE_FALSE(bad.empty());
  spec.shape = {4, 4};
  spec.device = device{device_kind::cuda, 0};
  managed_tensor gpu = testing::make_tensor(spec, count);
  REQUIRE_FALSE(nodes.out().publish(gpu).ok());
  REQUIRE_FALSE(gpu.empty());
  REQUIRE(count.calls.load() == 0);
  REQUIRE(nodes.out().publications() == 0);
  // A runtime has one node.
  absl::StatusOr<std::unique_ptr<remote_node>> second =
      remote_node::create(*nodes.exporter->rt, {});
  REQUIRE(second.status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE_THAT(std::string(second.status().message()), Catch::Contains("has a remote node"));
}

TEST_CASE("an imported tensor can be published on, and lands on a simulated GPU",
          "[remote][publish]") {
  node_pair nodes;
  // cpu:0 -> a view here -> published: the producer lives until the
  // importer released it and the view is gone.
  auto memory = std::make_shared<testing::laid_out>(testing::lay_out("transposed", {32, 16}, 4, 9));
  testing::deleter_count count;
  testing::tensor_spec spec;
  spec.shape = memory->shape;
  spec.strides = memory->strides;
  spec.data = memory->data();
  managed_tensor source = testing::make_tensor(spec, count);
  absl::StatusOr<tensor> view = import_view(*nodes.exporter->rt, source);
  REQUIRE(view.ok());
  absl::StatusOr<remote_descriptor> d = nodes.out().publish(*view);
  REQUIRE(d.ok());
  *view = tensor();
  REQUIRE(count.calls.load() == 0);  // the publication holds it

  testing::sim_runtime sim = testing::make_sim_runtime();
  remote_node_options no;
  auto gpu_node = remote_node::create(*sim.rt, no);
  REQUIRE(gpu_node.ok());
  import_options o;
  o.target = device{device_kind::cuda, 0};
  absl::StatusOr<tensor> t = import_now(**gpu_node, *d, o);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  REQUIRE(t->device() == (device{device_kind::cuda, 0}));
  REQUIRE(testing::eventually([&] { return count.calls.load() == 1; }));
  // Back to the host through a local import, to compare.
  managed_tensor back(*t->to_dlpack_versioned());
  import_options h;
  h.target = host_device;
  std::future<absl::StatusOr<tensor>> f = async_import_dlpack(*sim.rt, back, h, asio::use_future);
  REQUIRE(f.wait_for(30s) == std::future_status::ready);
  absl::StatusOr<tensor> host = f.get();
  REQUIRE(host.ok());
  check_bytes(*host, "transposed", {32, 16}, dtypes::float32, 9);
  (*gpu_node)->shutdown();
}

}  // namespace dlasync

namespace dlasync {

TEST_CASE("the bytes arrive the same by RMA get between trusted peers and as the exporter's pieces",
          "[remote][fetch]") {
  const remote_fetch fetch = GENERATE(remote_fetch::rma, remote_fetch::active_messages);
  INFO("fetch " << static_cast<int>(fetch));
  const bool trusted = fetch == remote_fetch::rma;
  auto out = make_importer("", 0, trusted);
  auto in = std::make_unique<importer>();
  in->rt = testing::make_runtime(2);
  remote_node_options o;
  o.fetch = fetch;
  o.trusted_peers = trusted;
  in->node = *remote_node::create(*in->rt, o);
  unsigned seed = 40;
  for (const std::string& layout : testing::layouts()) {
    for (const dtype& type : {dtypes::uint8, dtypes::float64}) {
      const std::vector<std::int64_t> shape = shape_for(layout, type);
      INFO(layout << " " << type.name());
      auto p = publish_here(*out->node, layout, shape, {}, ++seed, type);
      import_options io;
      io.target = device{device_kind::cpu, 1};
      absl::StatusOr<tensor> t = import_now(*in->node, p->descriptor, io);
      INFO(t.status().ToString());
      REQUIRE(t.ok());
      REQUIRE(t->device() == io.target);
      check_bytes(*t, layout, shape, type, seed);
      REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
    }
  }
}

}  // namespace dlasync

namespace dlasync {

TEST_CASE("nodes with different transport lists connect, and the bytes arrive",
          "[remote][transports]") {
  // A shared-memory list has no peer error handling; UCX refuses an
  // endpoint whose ends disagree on it, so the listener takes the
  // connecting node's choice.
  const auto [exporting, importing] = GENERATE(std::pair<std::string, std::string>{"shm", ""},
                                               std::pair<std::string, std::string>{"", "shm"},
                                               std::pair<std::string, std::string>{"tcp", "shm"});
  INFO("exporter " << exporting << ", importer " << importing);
  auto out = make_importer(exporting);
  auto in = make_importer(importing);
  auto p = publish_here(*out->node, "transposed", {64, 48});
  absl::StatusOr<tensor> t = import_now(*in->node, p->descriptor);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  check_bytes(*t, "transposed", {64, 48}, dtypes::float32, 1);
  REQUIRE(testing::eventually([&] { return p->count.calls.load() == 1; }));
}

}  // namespace dlasync
