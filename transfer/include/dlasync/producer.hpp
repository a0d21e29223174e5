// dlasync/producer.hpp
//
// Producing DLPack tensors. `make_managed_tensor` describes memory that the
// caller owns as a DLPack managed tensor, as a framework or a network stack
// does when it hands a tensor on: a network buffer, a pinned block, an
// array of its own. The managed tensor owns copies of the shape and
// strides; its deleter calls the caller's `release` exactly once (to free
// the memory, or to drop a reference to its owner) and then frees the
// description.
//
// Example, a frame's payload handed to an import without a copy:
//
//   std::shared_ptr<frame> f = receive();
//   dlasync::managed_tensor t = dlasync::make_managed_tensor(
//       {.data = f->payload(), .dtype = dlasync::dtypes::float32, .shape = {64, 64}},
//       [f] {});  // the frame lives until the tensor's last user is done
//
// Thread safety: the function is safe from any thread; the deleter may run
// on any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "dlasync/device.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/dtype.hpp"

namespace dlasync {

// What a producer says of its memory: DLTensor's fields.
struct tensor_description {
  void* data = nullptr;
  dlasync::device device = host_device;
  dlasync::dtype dtype = dtypes::float32;
  std::vector<std::int64_t> shape{};
  // Strides in elements; empty means compact row-major, exported as NULL
  // strides as DLPack allows.
  std::optional<std::vector<std::int64_t>> strides{};
  std::uint64_t byte_offset = 0;
  // Versioned flags (flag_read_only, ...); legacy tensors have none.
  std::uint64_t flags = 0;
};

// Which DLPack struct to produce: a DLManagedTensorVersioned of DLPack 1.3,
// or a legacy DLManagedTensor for consumers of DLPack 0.x.
enum class dlpack_abi : std::uint8_t { versioned, legacy };

// A managed tensor describing `d`, whose deleter calls `release` (when set)
// exactly once. Nothing is checked: validation is the consumer's job, and
// a producer may describe what it likes.
managed_tensor make_managed_tensor(tensor_description d,
                                   absl::AnyInvocable<void() &&> release = nullptr,
                                   dlpack_abi abi = dlpack_abi::versioned);

}  // namespace dlasync
