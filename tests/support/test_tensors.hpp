// Test support: managed tensors built from a description, with deleters that
// count their calls, so that tests can prove each runs exactly once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "catch2/catch.hpp"
#include "dlasync/transfer/dlpack.hpp"
#include "dlasync/transfer/dtype.hpp"
#include "dlasync/transfer/managed_tensor.hpp"

namespace dlasync::testing {

struct deleter_count {
  std::atomic<int> calls{0};
  // Runs in the deleter, before the count: tests free the tensor's memory
  // here, so that a read after the release shows under ASan.
  std::function<void()> on_delete;
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

namespace detail {

template <typename Managed>
struct box {
  Managed managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  deleter_count* count = nullptr;

  static void destroy(Managed* self) {
    auto* b = static_cast<box*>(self->manager_ctx);
    if (b->count != nullptr) {
      if (b->count->on_delete) b->count->on_delete();
      b->count->calls.fetch_add(1);
    }
    delete b;
  }
};

template <typename Managed>
Managed* build(const tensor_spec& spec, deleter_count* count) {
  auto* b = new box<Managed>;
  b->shape = spec.shape;
  b->count = count;
  DLTensor& dl = b->managed.dl_tensor;
  dl.data = spec.data;
  dl.device = to_dl_device(spec.device);
  dl.ndim = spec.ndim.value_or(static_cast<std::int32_t>(spec.shape.size()));
  dl.dtype = spec.type.to_dl();
  dl.shape = spec.null_shape ? nullptr : b->shape.data();
  if (spec.strides) {
    b->strides = *spec.strides;
    dl.strides = b->strides.data();
  }
  dl.byte_offset = spec.byte_offset;
  b->managed.manager_ctx = b;
  b->managed.deleter = &box<Managed>::destroy;
  return &b->managed;
}

}  // namespace detail

// A versioned or legacy managed tensor as `spec` says, whose deleter counts
// into `count`.
inline managed_tensor make_tensor(const tensor_spec& spec, deleter_count& count) {
  if (spec.versioned) {
    DLManagedTensorVersioned* t = detail::build<DLManagedTensorVersioned>(spec, &count);
    t->version = spec.version;
    t->flags = spec.flags;
    return managed_tensor(t);
  }
  return managed_tensor(detail::build<DLManagedTensor>(spec, &count));
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
