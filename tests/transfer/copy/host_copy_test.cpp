// The host copies and the copy engine's entry, built on the copy engine's
// parts alone (copy_rig.hpp: a work pool and a host backend; no runtime,
// no CUDA): copy_on_host on a host stream, split among the workers when
// large, stopped by a cancellation between pieces, waiting for a producer's
// point; copy_here on the calling thread with helpers; start_copy's
// dispatch and the byte counters' paths.
#include "transfer/src/copy/host_copy.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "catch2/catch.hpp"
#include "support/test_tensors.hpp"
#include "transfer/copy/copy_rig.hpp"
#include "transfer/src/copy/transfer_path.hpp"

namespace dlasync::detail {
namespace {

using testing::require_status;

constexpr device cpu0{device_kind::cpu, 0};

testing::copy_rig host_rig(std::uint64_t parallel_copy_bytes = 1 << 20) {
  return testing::copy_rig({.cuda = false, .parallel_copy_bytes = parallel_copy_bytes});
}

// A `rows` x `cols` float matrix whose rows lie `pad` floats apart in the
// source: element (i, j) at i * (cols + pad) + j.
struct padded_source {
  static constexpr std::int64_t pad = 3;
  std::int64_t rows;
  std::int64_t cols;
  std::vector<float> in;
  std::vector<float> out;

  padded_source(std::int64_t r, std::int64_t c)
      : rows(r),
        cols(c),
        in(static_cast<std::size_t>(r * (c + pad))),
        out(static_cast<std::size_t>(r * c), -1.0F) {
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) + 0.25F;
  }

  copy_request request() {
    copy_request r;
    r.path = transfer_path::host_to_host;
    r.source = cpu0;
    r.target = cpu0;
    r.from = in.data();
    r.to = out.data();
    r.layout = {4, {rows, cols}, {cols + pad, 1}};
    r.bytes = out.size() * sizeof(float);
    r.control = std::make_shared<copy_control>();
    return r;
  }

  std::size_t wrong() const {
    std::size_t n = 0;
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < cols; ++j) {
        n += out[static_cast<std::size_t>(i * cols + j)] !=
                     in[static_cast<std::size_t>(i * (cols + pad) + j)]
                 ? 1
                 : 0;
      }
    }
    return n;
  }
};

// The pieces run_units makes of a copy run by one thread: a check for
// cancellation about every 256 KiB.
std::int64_t pieces_of(const strided_copy& copy) {
  const auto unit = std::max<std::uint64_t>(copy.unit_bytes(), 1);
  const auto step = static_cast<std::int64_t>(std::max<std::uint64_t>(1, (256 << 10) / unit));
  return (copy.units() + step - 1) / step;
}

}  // namespace

TEST_CASE("copy_on_host gathers a strided source on a host stream", "[transfer][copy][host]") {
  testing::copy_rig rig = host_rig();
  std::atomic<int> pieces{0};
  rig.unit_observer = [&pieces] { pieces.fetch_add(1, std::memory_order_relaxed); };
  padded_source s(64, 48);
  copy_request r = s.request();
  const std::shared_ptr<copy_control> control = r.control;
  REQUIRE(testing::finished(copy_on_host(rig.services(), {cpu0, 0}, r)).ok());
  CHECK(s.wrong() == 0);
  CHECK_FALSE(control->aborted.load());
  CHECK(pieces.load() >= 1);
}

TEST_CASE("a host copy above parallel_copy_bytes is split among the workers, every byte landed",
          "[transfer][copy][host]") {
  // 1 MiB of floats against a split threshold of 64 KiB: two parts, one
  // per worker, each reporting its pieces.
  testing::copy_rig rig = host_rig(64 << 10);
  std::atomic<int> pieces{0};
  rig.unit_observer = [&pieces] { pieces.fetch_add(1, std::memory_order_relaxed); };
  padded_source s(512, 512);
  REQUIRE(strided_copy(s.request().layout).units() >= 2);
  REQUIRE(testing::finished(copy_on_host(rig.services(), {cpu0, 1}, s.request())).ok());
  CHECK(s.wrong() == 0);
  CHECK(pieces.load() >= 2);
}

TEST_CASE("a host copy cancelled between pieces stops early and says so",
          "[transfer][copy][host][cancel]") {
  testing::copy_rig rig = host_rig(std::uint64_t{1} << 40);  // one part
  padded_source s(1024, 1024);                               // 4 MiB: pieces of about 256 KiB
  copy_request r = s.request();
  REQUIRE(pieces_of(strided_copy(r.layout)) >= 2);
  const std::shared_ptr<copy_control> control = r.control;
  std::atomic<int> pieces{0};
  rig.unit_observer = [&] {
    pieces.fetch_add(1, std::memory_order_relaxed);
    control->cancel_requested.store(true, std::memory_order_release);
  };
  REQUIRE(testing::finished(copy_on_host(rig.services(), {cpu0, 0}, r)).ok());
  CHECK(control->aborted.load());
  CHECK(pieces.load() == 1);
  CHECK(s.wrong() > 0);  // incomplete, as aborted says
}

TEST_CASE("a host copy cancelled before its task runs copies nothing",
          "[transfer][copy][host][cancel]") {
  testing::copy_rig rig = host_rig();
  padded_source s(32, 32);
  copy_request r = s.request();
  r.control->cancel_requested = true;
  const std::shared_ptr<copy_control> control = r.control;
  REQUIRE(testing::finished(copy_on_host(rig.services(), {cpu0, 0}, r)).ok());
  CHECK(control->aborted.load());
  CHECK(s.wrong() == s.out.size());
}

TEST_CASE("copy_on_host reads a produced source only once the producer's point is reached",
          "[transfer][copy][host]") {
  testing::copy_rig rig = host_rig();
  std::atomic<int> pieces{0};
  rig.unit_observer = [&pieces] { pieces.fetch_add(1, std::memory_order_relaxed); };
  padded_source s(16, 16);
  copy_request r = s.request();
  SECTION("the producer gets there") {
    auto produced = std::make_shared<completion_marker>();
    r.produced = produced;
    marker_ptr copied = copy_on_host(rig.services(), {cpu0, 0}, r);
    // Nothing is enqueued before the producer's point completes.
    CHECK_FALSE(copied->done());
    CHECK(pieces.load() == 0);
    produced->complete(absl::OkStatus());
    REQUIRE(testing::finished(copied).ok());
    CHECK(s.wrong() == 0);
  }
  SECTION("the producer's point failed: its status, and nothing copied") {
    r.produced = done_marker(absl::InternalError("cudaEventRecord failed on cuda:0"));
    require_status(testing::finished(copy_on_host(rig.services(), {cpu0, 0}, r)),
                   absl::StatusCode::kInternal, {"cudaEventRecord"});
    CHECK(pieces.load() == 0);
    CHECK(s.wrong() == s.out.size());
  }
}

TEST_CASE("copy_here copies on the calling thread, with helpers when large",
          "[transfer][copy][host]") {
  const bool large = GENERATE(false, true);
  INFO((large ? "4 MiB, split at 64 KiB" : "4 KiB, below the split"));
  testing::copy_rig rig = host_rig(64 << 10);
  std::atomic<int> pieces{0};
  rig.unit_observer = [&pieces] { pieces.fetch_add(1, std::memory_order_relaxed); };
  padded_source s(large ? 1024 : 32, large ? 1024 : 32);
  copy_request r = s.request();
  const strided_copy copy(r.layout);
  copy_here(rig.services(), copy, r.from, r.to);
  // Every byte is written when it returns, whoever copied it.
  CHECK(s.wrong() == 0);
  // Slices of a quarter of parallel_copy_bytes, each reported once; one
  // piece below the split.
  const std::int64_t slices =
      std::min<std::int64_t>(static_cast<std::int64_t>(copy.bytes() / (16 << 10)), copy.units());
  if (large) REQUIRE(slices >= 2);
  CHECK(pieces.load() == (large ? slices : 1));
}

TEST_CASE("start_copy runs each path's copy and refuses a view", "[transfer][copy]") {
  testing::copy_rig rig = host_rig();
  padded_source s(8, 8);
  copy_request r = s.request();
  REQUIRE(testing::finished(start_copy(rig.services(), {cpu0, 0}, r)).ok());
  CHECK(s.wrong() == 0);
  r.path = transfer_path::view;
  require_status(testing::finished(start_copy(rig.services(), {cpu0, 0}, r)),
                 absl::StatusCode::kInternal, {"start_copy was given a view"});
}

TEST_CASE("each copying path counts its bytes on its own counter, views on none",
          "[transfer][copy]") {
  CHECK(counted_path(transfer_path::host_to_host) == byte_path::host_to_host);
  CHECK(counted_path(transfer_path::pinned_to_gpu) == byte_path::pinned_to_gpu);
  CHECK(counted_path(transfer_path::pageable_to_gpu) == byte_path::pageable_to_gpu);
  CHECK(counted_path(transfer_path::gpu_to_host) == byte_path::gpu_to_host);
  CHECK(counted_path(transfer_path::within_gpu) == byte_path::within_gpu);
  CHECK(counted_path(transfer_path::gpu_to_gpu) == byte_path::gpu_to_gpu);
  CHECK_FALSE(counted_path(transfer_path::view).has_value());
  CHECK_FALSE(counted_path(transfer_path::view_after_producer).has_value());
}

}  // namespace dlasync::detail
