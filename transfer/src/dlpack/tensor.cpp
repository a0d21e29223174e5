#include "dlasync/tensor.hpp"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "dlasync/validate.hpp"
#include "transfer/src/dlpack/block_cache.hpp"
#include "transfer/src/dlpack/tensor_factory.hpp"
#include "transfer/src/layout/strided_layout.hpp"

namespace dlasync {
namespace {

struct view_state final : detail::tensor_state {
  managed_tensor source;
};

struct copy_state final : detail::tensor_state {
  device_buffer buffer;
  // The budget the buffer's bytes hold, given back after the buffer: an
  // inline host copy holds it here rather than in a second release
  // function around the buffer's, which would be an allocation.
  std::shared_ptr<memory_budget> budget;
  std::uint64_t budget_bytes = 0;

  copy_state() = default;
  copy_state(const copy_state&) = delete;
  copy_state& operator=(const copy_state&) = delete;
  ~copy_state() override {
    buffer.reset();
    if (budget) budget->release(budget_bytes);
  }
};

void fill_compact_strides(detail::tensor_state& state) {
  const auto n = static_cast<std::size_t>(state.ndim);
  detail::row_major_strides({state.dims.data(), n}, {state.dims.data() + n, n});
}

// An exported managed tensor: the DLPack struct, its own copy of the extents
// and strides (a consumer may not scribble on ours), and a reference.
template <typename Managed>
struct export_holder {
  Managed managed{};
  absl::InlinedVector<std::int64_t, 8> dims;
  std::shared_ptr<const detail::tensor_state> ref;

  static void destroy(Managed* self) noexcept {
    delete static_cast<export_holder*>(self->manager_ctx);
  }
};

template <typename Managed>
Managed* export_as(const std::shared_ptr<const detail::tensor_state>& state) {
  auto* holder = new export_holder<Managed>;
  holder->dims = state->dims;
  holder->ref = state;
  DLTensor& dl = holder->managed.dl_tensor;
  dl.data = state->data;
  dl.device = to_dl_device(state->device);
  dl.ndim = state->ndim;
  dl.dtype = state->type.to_dl();
  dl.shape = holder->dims.data();
  dl.strides = holder->dims.data() + state->ndim;
  dl.byte_offset = state->byte_offset;
  holder->managed.manager_ctx = holder;
  holder->managed.deleter = &export_holder<Managed>::destroy;
  return &holder->managed;
}

absl::Status empty_error() {
  return absl::FailedPreconditionError("cannot export an empty dlasync::tensor");
}

}  // namespace

namespace detail {

tensor tensor_factory::make_view(managed_tensor source, const import_plan& plan) {
  // Default-initialized: every member has its initializer, and value
  // initialization would first zero the whole state (a `rep stos` that cost
  // about a tenth of a fast-path import).
  // Its block comes from this thread's cache (block_cache.hpp).
  auto state = std::allocate_shared_for_overwrite<view_state>(cached_allocator<view_state>());
  const DLTensor& dl = *source.dl_tensor();
  state->device = plan.target;
  state->type = plan.type;
  state->ndim = plan.ndim;
  state->storage = tensor_storage::view;
  state->read_only = plan.read_only;
  state->compact = plan.compact;
  state->flags = plan.flags | (plan.read_only ? flag_read_only : 0);
  state->data = dl.data;
  state->byte_offset = dl.byte_offset;
  state->element_count = plan.element_count;
  state->byte_size = plan.byte_size;
  state->dims.resize(2 * static_cast<std::size_t>(plan.ndim));
  std::int64_t* shape = state->dims.data();
  std::int64_t* strides = shape + plan.ndim;
  std::copy_n(dl.shape, plan.ndim, shape);
  if (dl.strides != nullptr) {
    std::copy_n(dl.strides, plan.ndim, strides);
  } else {
    fill_compact_strides(*state);
  }
  state->source = std::move(source);
  return tensor(std::move(state));
}

tensor tensor_factory::make_copy(device_buffer buffer, const import_plan& plan,
                                 std::span<const std::int64_t> shape,
                                 std::shared_ptr<std::atomic<std::int64_t>> stream,
                                 std::shared_ptr<memory_budget> budget) {
  // From this thread's block cache, as a view's state (make_view).
  auto state = std::allocate_shared_for_overwrite<copy_state>(cached_allocator<copy_state>());
  state->device = plan.target;
  state->type = plan.type;
  state->ndim = plan.ndim;
  state->storage = tensor_storage::copy;
  state->data = buffer.data();
  state->element_count = plan.element_count;
  state->byte_size = plan.byte_size;
  state->dims.resize(2 * static_cast<std::size_t>(plan.ndim));
  std::copy(shape.begin(), shape.end(), state->dims.begin());
  fill_compact_strides(*state);
  state->budget_bytes = budget ? plan.byte_size : 0;
  state->buffer = std::move(buffer);
  state->budget = std::move(budget);
  state->stream = std::move(stream);
  return tensor(std::move(state));
}

}  // namespace detail

absl::Status tensor::set_stream(std::int64_t s) const {
  if (state_ == nullptr) return empty_error();
  if (!state_->stream) {
    return absl::FailedPreconditionError(absl::StrCat(
        "set_stream applies to GPU copies, whose memory dlasync frees stream-ordered; this ",
        is_view() ? "view" : "copy", " on ", state_->device.name(),
        " has no stream: its memory is released when the last reference goes"));
  }
  if (s == 0 || s == stream_per_thread_default || s < stream_no_sync || s == stream_no_sync) {
    return absl::InvalidArgumentError(absl::StrCat(
        "set_stream(", s,
        ") names no stream that the free can follow: pass a stream handle of the tensor's GPU, "
        "or 1 for the legacy default stream (2, the per-thread default stream, would name "
        "another stream on the thread that frees)"));
  }
  state_->stream->store(s);
  return absl::OkStatus();
}

absl::StatusOr<DLManagedTensorVersioned*> tensor::to_dlpack_versioned() const {
  if (state_ == nullptr) return empty_error();
  DLManagedTensorVersioned* out = export_as<DLManagedTensorVersioned>(state_);
  out->version = DLPackVersion{dlpack_major_version, dlpack_minor_version};
  out->flags = state_->flags;
  return out;
}

absl::StatusOr<DLManagedTensor*> tensor::to_dlpack_legacy() const {
  if (state_ == nullptr) return empty_error();
  if (state_->read_only) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot export a read-only ", state_->device.name(),
        " tensor as legacy DLPack, which has no read-only flag and would hand it on as "
        "writable; export it versioned (to_dlpack_versioned) or copy it first"));
  }
  return export_as<DLManagedTensor>(state_);
}

absl::StatusOr<tensor> import_view(managed_tensor& source, const import_options& options,
                                   const device_registry& registry) {
  absl::StatusOr<import_plan> plan = plan_import(source, options, registry);
  if (!plan.ok()) return plan.status();
  // Without a runtime there is no CUDA runtime to ask where GPU memory lies,
  // and nothing to follow a producer's stream with: refused, not promised.
  if (is_gpu_memory(plan->source.kind) || plan->source.kind == device_kind::cuda_host) {
    return with_import_error(
        absl::FailedPreconditionError(absl::StrCat(
            "import_view with a device registry alone takes host memory, not ", plan->source.name(),
            ", whose location only the CUDA runtime can confirm; the tensor was not consumed: "
            "call import_view(runtime, source, options)")),
        {false, "location", plan->copy_reason_names()});
  }
  if (plan->needs_copy()) {
    return with_import_error(
        absl::FailedPreconditionError(absl::StrCat(
            "a zero-copy view of this tensor is not possible: ", plan->copy_reason_text(),
            "; the tensor was not consumed: use the asynchronous import, which copies")),
        {false, "copy", plan->copy_reason_names()});
  }
  return detail::tensor_factory::make_view(std::move(source), *plan);
}

}  // namespace dlasync
