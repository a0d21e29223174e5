// Test support: managed tensors built from a description with the public
// producer helper, with deleters that count their calls, so that tests can
// prove each runs exactly once.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "catch2/catch.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/dtype.hpp"
#include "dlasync/producer.hpp"

namespace dlasync::testing {

// The second host device of the tests' runtimes (make_runtime has two).
inline constexpr device second_cpu{device_kind::cpu, 1};

struct deleter_count {
  std::atomic<int> calls{0};
  // Tensors made with this count (make_tensor).
  std::atomic<int> made{0};
  // Runs in the deleter, before the count: tests free the tensor's memory
  // here, so that a read after the release shows under ASan.
  std::function<void()> on_delete;

  deleter_count() = default;
  deleter_count(const deleter_count&) = delete;
  deleter_count& operator=(const deleter_count&) = delete;
  // A deleter still to run would write into this count once it is gone (a
  // copy's deleter runs on the runtime's releaser, perhaps after the
  // result arrived): the test must wait for it first (released(), or the
  // runtime's shutdown). Said loudly, where it would otherwise corrupt
  // memory; while a failed REQUIRE unwinds, only said.
  ~deleter_count() {
    if (made.load() <= calls.load()) return;
    std::fprintf(stderr,
                 "deleter_count destroyed with %d of its %d deleters still to run: wait for "
                 "them (testing::released, or shut the runtime down) before it goes\n",
                 made.load() - calls.load(), made.load());
    if (std::uncaught_exceptions() == 0) std::abort();
  }
};

struct tensor_spec {
  dlasync::device device = host_device;
  dlasync::dtype type = dtypes::float32;
  std::vector<std::int64_t> shape;
  std::optional<std::vector<std::int64_t>> strides;  // empty: NULL strides
  void* data = nullptr;
  std::uint64_t byte_offset = 0;
  std::uint64_t flags = 0;
  DLPackVersion version{1, 3};
  bool versioned = true;
  bool null_shape = false;
  std::optional<std::int32_t> ndim;  // overrides shape.size()
};

// A float32 matrix of `rows` x `cols` on cpu:0 with values 0, 1, 2, ...,
// and the spec that describes it.
struct matrix_source {
  std::vector<float> data;
  tensor_spec spec;
  matrix_source(std::int64_t rows, std::int64_t cols)
      : data(static_cast<std::size_t>(rows * cols)) {
    std::iota(data.begin(), data.end(), 0.0f);
    spec.shape = {rows, cols};
    spec.data = data.data();
  }
  std::uint64_t bytes() const { return data.size() * sizeof(float); }
};

// A versioned or legacy managed tensor as `spec` says, whose deleter counts
// into `count`: the public producer helper, then whatever the spec gets
// wrong on purpose (a version, a NULL shape, an ndim that disagrees with
// the shape), for validation to catch.
inline managed_tensor make_tensor(const tensor_spec& spec, deleter_count& count) {
  tensor_description d;
  d.data = spec.data;
  d.device = spec.device;
  d.dtype = spec.type;
  d.shape = spec.shape;
  d.strides = spec.strides;
  d.byte_offset = spec.byte_offset;
  d.flags = spec.flags;
  count.made.fetch_add(1);
  managed_tensor t = make_managed_tensor(
      std::move(d),
      [&count] {
        if (count.on_delete) count.on_delete();
        count.calls.fetch_add(1);
      },
      spec.versioned ? dlpack_abi::versioned : dlpack_abi::legacy);
  if (spec.versioned) t.versioned()->version = spec.version;
  DLTensor& dl = spec.versioned ? t.versioned()->dl_tensor : t.legacy()->dl_tensor;
  if (spec.null_shape) dl.shape = nullptr;
  if (spec.ndim) dl.ndim = *spec.ndim;
  return t;
}

// Checks the code and that the message holds every word.
inline void require_status(const absl::Status& status, absl::StatusCode code,
                           std::initializer_list<const char*> words) {
  INFO("status: " << status.ToString());
  REQUIRE(status.code() == code);
  const std::string message(status.message());
  for (const char* word : words) {
    INFO("expected word: " << word);
    CHECK(message.find(word) != std::string::npos);
  }
}

}  // namespace dlasync::testing
