// dlasync/tensor.hpp
//
// `dlasync::tensor` is an imported tensor: its device, dtype, shape, strides
// (in elements), data and whether it is a zero-copy view of the producer's
// memory or a copy that dlasync owns. A tensor is a cheap shared handle:
// copies of it share one state. A view keeps the producer's managed tensor
// alive and calls its deleter exactly once, when the last reference (tensor
// copies and exported managed tensors alike) goes away.
//
// Example:
//
//   dlasync::managed_tensor source(producer_export());
//   absl::StatusOr<dlasync::tensor> t = dlasync::import_view(source, {}, registry);
//   if (!t.ok()) return t.status();  // `source` still owns the tensor
//   float* x = static_cast<float*>(t->data());
//   DLManagedTensorVersioned* out = *t->to_dlpack_versioned();  // hand on
//
// A tensor is read-only when the producer flagged it READ_ONLY or when its
// strides are zero (broadcast) or negative; writing through `data()` is then
// the caller's error.
//
// Thread safety: distinct objects are safe; a shared object is safe for
// concurrent const use. The referenced memory is not synchronized.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "dlasync/device.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/dlpack_stream.hpp"
#include "dlasync/dtype.hpp"

namespace dlasync {

enum class tensor_storage : std::uint8_t {
  view,  // the producer's memory, kept alive by its managed tensor
  copy,  // memory that dlasync allocated and owns
};

namespace detail {

// The shared state behind `dlasync::tensor`: the description, plus whatever
// keeps the memory alive (a derived type: the producer's managed tensor for a
// view, an allocation for a copy). One allocation holds both.
struct tensor_state {
  virtual ~tensor_state() = default;

  dlasync::device device;
  dlasync::dtype type;
  std::int32_t ndim = 0;
  tensor_storage storage = tensor_storage::view;
  bool read_only = false;
  bool compact = true;
  std::uint64_t flags = 0;
  void* data = nullptr;  // as in DLTensor: the first element is at data + byte_offset
  std::uint64_t byte_offset = 0;
  std::int64_t element_count = 0;
  std::uint64_t byte_size = 0;
  // ndim extents, then ndim strides in elements.
  absl::InlinedVector<std::int64_t, 8> dims;
  // A GPU copy's stream (DLPack encoding), on which its memory is freed;
  // null for views and host copies.
  std::shared_ptr<std::atomic<std::int64_t>> stream;
};

struct tensor_factory;

}  // namespace detail

class tensor {
 public:
  // An empty tensor.
  tensor() noexcept = default;

  bool empty() const noexcept { return state_ == nullptr; }
  explicit operator bool() const noexcept { return state_ != nullptr; }

  // The accessors below require a non-empty tensor.
  dlasync::device device() const noexcept { return state_->device; }
  dlasync::dtype dtype() const noexcept { return state_->type; }
  std::int32_t ndim() const noexcept { return state_->ndim; }
  std::span<const std::int64_t> shape() const noexcept {
    return {state_->dims.data(), static_cast<std::size_t>(state_->ndim)};
  }
  // Strides in elements; always present, also when the producer gave NULL.
  std::span<const std::int64_t> strides() const noexcept {
    return {state_->dims.data() + state_->ndim, static_cast<std::size_t>(state_->ndim)};
  }
  std::int64_t element_count() const noexcept { return state_->element_count; }
  // Bytes of the elements stored compactly (packed for sub-byte types).
  std::uint64_t byte_size() const noexcept { return state_->byte_size; }
  // The first element.
  void* data() const noexcept {
    // Integer arithmetic: validation bounds the offset of tensors with
    // elements, but a size-0 tensor's offset is unchecked and may wrap.
    if (state_->data == nullptr) return nullptr;
    const std::uintptr_t first =
        reinterpret_cast<std::uintptr_t>(state_->data) + state_->byte_offset;
    // NOLINTNEXTLINE(performance-no-int-to-ptr): integer arithmetic on purpose
    return reinterpret_cast<void*>(first);
  }
  // DLPack's pair: the first element is at dl_data() + byte_offset().
  void* dl_data() const noexcept { return state_->data; }
  std::uint64_t byte_offset() const noexcept { return state_->byte_offset; }
  bool read_only() const noexcept { return state_->read_only; }
  bool is_compact() const noexcept { return state_->compact; }
  tensor_storage storage() const noexcept { return state_->storage; }
  bool is_view() const noexcept { return state_->storage == tensor_storage::view; }
  bool is_copy() const noexcept { return state_->storage == tensor_storage::copy; }
  // The producer's DLPack flags that dlasync knows (READ_ONLY, IS_COPIED,
  // IS_SUBBYTE_TYPE_PADDED); READ_ONLY is also set for read-only strides.
  std::uint64_t flags() const noexcept { return state_->flags; }
  // References to the state: tensor copies plus live exports.
  long use_count() const noexcept { return state_.use_count(); }

  // The stream of a GPU copy (DLPack encoding: a cudaStream_t as an
  // integer, or 1 for the legacy default stream), as RMM's device_buffer
  // has one: the copy was made in its order, and its memory is freed on it,
  // stream-ordered, when the last reference goes. stream_no_sync (-1) for
  // views and host copies, whose memory has no stream.
  std::int64_t stream() const noexcept {
    return state_ != nullptr && state_->stream ? state_->stream->load() : stream_no_sync;
  }

  // Hands a GPU copy to the caller's stream `s` (a cudaStream_t of the
  // tensor's GPU, as an integer, or 1): the memory is then freed on `s`, after
  // the caller's work enqueued there before the last reference goes, with no
  // host synchronization. `s` must stay alive until then, and must already
  // follow the copy (it does once the import delivered the tensor without a
  // consumer stream, or when it was the import's consumer_stream). Applies
  // to every handle of this tensor. FailedPrecondition for an empty tensor,
  // a view or a host copy; InvalidArgument for 0, 2 (a per-thread default
  // stream names another stream on the thread that frees) or another
  // negative value.
  absl::Status set_stream(std::int64_t s) const;

  // Exports a new versioned managed tensor (DLPack 1.3) that shares this
  // tensor's memory; its deleter drops the reference. The caller owns the
  // result and must call its deleter once.
  //   FailedPrecondition on an empty tensor.
  absl::StatusOr<DLManagedTensorVersioned*> to_dlpack_versioned() const;

  // The same as a legacy managed tensor. Legacy DLPack cannot say
  // "read-only", so read-only tensors are refused (FailedPrecondition)
  // rather than handed on as writable: export them versioned, or copy.
  absl::StatusOr<DLManagedTensor*> to_dlpack_legacy() const;

 private:
  friend struct detail::tensor_factory;
  explicit tensor(std::shared_ptr<const detail::tensor_state> state) noexcept
      : state_(std::move(state)) {}

  std::shared_ptr<const detail::tensor_state> state_;
};

}  // namespace dlasync
