#include "dlasync/validate.hpp"

#include <algorithm>
#include <bit>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/src/device_registry_factory.hpp"
#include "runtime/src/status_macros.hpp"
#include "transfer/src/layout/strided_layout.hpp"
#include "transfer/src/validate/layout.hpp"

namespace dlasync {
namespace {

std::string dims_text(const std::int64_t* dims, std::int32_t n) {
  if (dims == nullptr) return "NULL";
  return absl::StrCat("[", absl::StrJoin(dims, dims + n, ", "), "]");
}

absl::Status check_options(const import_options& o) {
  if (o.min_alignment != 0 &&
      (!std::has_single_bit(o.min_alignment) || o.min_alignment > max_alignment)) {
    return absl::InvalidArgumentError(absl::StrCat("min_alignment ", o.min_alignment,
                                                   " is not a power of two up to ", max_alignment,
                                                   "; pass 0 for the element size"));
  }
  return absl::OkStatus();
}

absl::Status check_version(const managed_tensor& t) {
  if (t.empty()) {
    return absl::InvalidArgumentError(
        "the DLPack tensor is NULL (an empty handle: never set, moved from or released); a "
        "DLPack tensor may be consumed at most once, so export a fresh one");
  }
  if (!t.is_versioned()) return absl::OkStatus();
  const DLPackVersion v = t.version();
  if (v.major > dlpack_major_version) {
    return absl::UnimplementedError(absl::StrCat(
        "DLPack major version ", v.major, ".", v.minor, " is newer than this library reads (",
        dlpack_major_version, ".x); ask the producer for max_version (", dlpack_major_version, ", ",
        dlpack_minor_version, ")"));
  }
  if (v.major == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("versioned DLPack tensor claims version 0.", v.minor,
                     "; versioned tensors start at 1.0, so the producer wrote a corrupt version"));
  }
  return absl::OkStatus();
}

absl::Status check_shape(const DLTensor& dl, std::int64_t& elements) {
  if (dl.ndim < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ndim ", dl.ndim, " is negative; a tensor has 0 or more dimensions"));
  }
  if (dl.ndim > max_ndim) {
    return absl::OutOfRangeError(absl::StrCat("ndim ", dl.ndim, " is above the limit of ", max_ndim,
                                              " dimensions; reshape the tensor"));
  }
  if (dl.ndim > 0 && dl.shape == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape is NULL while ndim is ", dl.ndim, "; the producer must give ", dl.ndim, " extents"));
  }
  elements = 1;
  bool overflow = false;
  for (std::int32_t i = 0; i < dl.ndim; ++i) {
    if (dl.shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape[", i, "] is ", dl.shape[i], "; extents must be 0 or more"));
    }
    overflow = overflow || __builtin_mul_overflow(elements, dl.shape[i], &elements);
  }
  // A zero extent anywhere makes the tensor empty, whatever the others say.
  for (std::int32_t i = 0; i < dl.ndim; ++i) {
    if (dl.shape[i] == 0) {
      elements = 0;
      return absl::OkStatus();
    }
  }
  if (overflow) {
    return absl::OutOfRangeError(absl::StrCat("the element count of shape ",
                                              dims_text(dl.shape, dl.ndim), " overflows 64 bits"));
  }
  return absl::OkStatus();
}

absl::Status check_byte_size(dtype type, std::int64_t elements, std::uint64_t& bytes) {
  // Sub-byte types are packed: ceil(elements * bits / 8).
  std::uint64_t bits = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(elements), type.bits, &bits) ||
      bits / 8 > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return absl::OutOfRangeError(absl::StrCat("the byte size of ", elements, " elements of ",
                                              type.name(), " overflows 63 bits"));
  }
  bytes = (bits + 7) / 8;
  return absl::OkStatus();
}

absl::Status check_stream(const import_options& o, device source, const device_registry& r) {
  if (!o.stream || *o.stream == stream_no_sync) return absl::OkStatus();
  const std::int64_t s = *o.stream;
  if (source.kind == device_kind::cpu) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream ", s, " was given for a tensor in ", source.name(),
                     " memory, which has no streams; pass no stream (or -1)"));
  }
  if (s == 0 || s < stream_no_sync) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream ", s,
                     " is not a DLPack stream value; use -1 (no synchronization), 1 (legacy "
                     "default stream), 2 (per-thread default stream) or a stream handle"));
  }
  if (r.find(device_kind::cuda) == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("stream ", s, " was given for a tensor in ", source.name(),
                     " memory, but ordering after a CUDA stream needs the CUDA backend (",
                     cuda_support_note(), "); synchronize the producer and pass -1"));
  }
  return absl::OkStatus();
}

// Fills the plan's span, compactness and read-only bit from the strides.
absl::Status check_strides(const DLTensor& dl, dtype type, std::uint64_t byte_size,
                           import_plan& plan) {
  plan.compact = true;
  plan.read_only = (plan.flags & flag_read_only) != 0;
  if (plan.element_count == 0) return absl::OkStatus();

  std::int64_t expected = 1;
  for (std::int32_t i = dl.ndim - 1; i >= 0; --i) {
    const std::int64_t extent = dl.shape[i];
    const std::int64_t stride = dl.strides != nullptr ? dl.strides[i] : expected;
    if (extent != 1) {
      if (stride != expected) plan.compact = false;
      if (stride <= 0) plan.read_only = true;
    }
    expected *= extent;  // cannot overflow: bounded by the checked element count
  }
  // A compact tensor reaches its elements and no more.
  detail::element_reach reach{0, plan.element_count - 1};
  if (!plan.compact) {
    const auto n = static_cast<std::size_t>(dl.ndim);
    const std::optional<detail::element_reach> r = detail::reach_of({dl.shape, n}, {dl.strides, n});
    if (!r) {
      return absl::OutOfRangeError(
          absl::StrCat("the memory span of strides ", dims_text(dl.strides, dl.ndim),
                       " over shape ", dims_text(dl.shape, dl.ndim), " overflows 64 bits"));
    }
    reach = *r;
  }
  const std::int64_t low = reach.low;
  const std::int64_t high = reach.high;

  if (type.is_sub_byte()) {
    if (!plan.compact) {
      return absl::UnimplementedError(absl::StrCat(
          "strided ", type.name(),
          " tensors are not supported: packed sub-byte elements share bytes, so only compact "
          "row-major layouts can be imported; make it contiguous first"));
    }
    plan.span_begin = 0;
    plan.span_end = static_cast<std::int64_t>(byte_size);
    return absl::OkStatus();
  }

  // Both ends, and the width between them (which every consumer of the plan
  // computes as span_end - span_begin), fit in 64 signed bits.
  const std::int64_t element = type.bits / 8;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t width = 0;
  if (__builtin_mul_overflow(low, element, &begin) || __builtin_add_overflow(high, 1, &end) ||
      __builtin_mul_overflow(end, element, &end) || __builtin_sub_overflow(end, begin, &width)) {
    return absl::OutOfRangeError(absl::StrCat("the memory span of the strides, ", low, " to ", high,
                                              " elements of ", element,
                                              " bytes, overflows 64 bits"));
  }
  plan.span_begin = begin;
  plan.span_end = end;
  return absl::OkStatus();
}

// The first element's address and the span around it must be addresses.
absl::Status check_address(const DLTensor& dl, import_plan& plan) {
  if (plan.element_count == 0) return absl::OkStatus();
  if (dl.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("data is NULL but the tensor holds ", plan.element_count,
                     " elements; only size-0 tensors may have NULL data"));
  }
  const auto base = reinterpret_cast<std::uintptr_t>(dl.data);
  std::uintptr_t first = 0;
  std::uintptr_t last = 0;
  if (__builtin_add_overflow(base, dl.byte_offset, &first) ||
      // Unsigned negation: span_begin may be INT64_MIN.
      first < std::uintptr_t{0} - static_cast<std::uintptr_t>(plan.span_begin) ||
      __builtin_add_overflow(first, static_cast<std::uintptr_t>(plan.span_end), &last)) {
    return absl::OutOfRangeError(
        absl::StrCat("data ", absl::Hex(base), " + byte_offset ", dl.byte_offset,
                     " with a span of [", plan.span_begin, ", ", plan.span_end,
                     ") bytes leaves the address space; the byte offset or strides are corrupt"));
  }
  plan.address = first;
  return absl::OkStatus();
}

// `status` marked as refused by `rule`, the tensor not consumed.
[[gnu::noinline]] absl::Status refused_by(const char* rule, absl::Status status,
                                          const import_plan* plan) {
  return with_import_error(std::move(status),
                           {false, rule, plan != nullptr ? plan->copy_reason_names() : ""});
}

// The fast path passes every rule: nothing is built for an OK status.
inline absl::Status ruled(const char* rule, absl::Status status,
                          const import_plan* plan = nullptr) {
  if (status.ok()) [[likely]]
    return status;
  return refused_by(rule, std::move(status), plan);
}

std::string device_pair(const import_plan& p) {
  return absl::StrCat(p.source.name(), " to ", p.target.name());
}

}  // namespace

std::string import_plan::copy_reason_names() const {
  std::vector<const char*> names;
  if (has(copy_reason::requested)) names.push_back("requested");
  if (has(copy_reason::cross_device)) names.push_back("cross_device");
  if (has(copy_reason::alignment)) names.push_back("alignment");
  if (has(copy_reason::contiguity)) names.push_back("contiguity");
  if (has(copy_reason::writable)) names.push_back("writable");
  if (has(copy_reason::page_locked)) names.push_back("page_locked");
  return absl::StrJoin(names, ",");
}

std::string import_plan::copy_reason_text() const {
  std::vector<std::string> parts;
  if (has(copy_reason::requested)) parts.emplace_back("requested (copy=true)");
  if (has(copy_reason::cross_device)) {
    parts.push_back(absl::StrCat("cross-device (", device_pair(*this), ")"));
  }
  if (has(copy_reason::alignment)) {
    parts.push_back(absl::StrCat("alignment (first element at ", absl::Hex(address),
                                 ", target requires ", alignment, " bytes)"));
  }
  if (has(copy_reason::contiguity)) {
    parts.emplace_back("contiguity (strides are not row-major and require_contiguous is set)");
  }
  if (has(copy_reason::writable)) {
    parts.push_back(absl::StrCat(
        "writability (the source is read-only",
        (flags & flag_read_only) != 0 ? ", flag READ_ONLY" : ", zero or negative strides",
        ", and require_writable is set)"));
  }
  if (has(copy_reason::page_locked)) {
    parts.push_back(absl::StrCat("page-locked target (", target.name(),
                                 " is page-locked memory and the source is labelled pageable ",
                                 source.name(),
                                 " memory; a producer whose pages are locked "
                                 "exports them as cuda_host)"));
  }
  return parts.empty() ? std::string("none") : absl::StrJoin(parts, ", ");
}

namespace detail {

absl::Status plan_import_into(const managed_tensor& tensor, const import_options& options,
                              const device_registry& registry, import_plan& plan) {
  plan = import_plan{};
  DLASYNC_RETURN_IF_ERROR(ruled("options", check_options(options)));
  DLASYNC_RETURN_IF_ERROR(ruled("version", check_version(tensor)));
  const DLTensor& dl = *tensor.dl_tensor();

  plan.versioned = tensor.is_versioned();
  plan.flags = tensor.flags() & known_flags;
  plan.ndim = dl.ndim;
  plan.type = dtype::from_dl(dl.dtype);
  DLASYNC_RETURN_IF_ERROR(ruled("shape", check_shape(dl, plan.element_count)));
  DLASYNC_RETURN_IF_ERROR(ruled("dtype", check_dtype(plan.type, plan.flags)));
  DLASYNC_RETURN_IF_ERROR(
      ruled("byte_size", check_byte_size(plan.type, plan.element_count, plan.byte_size)));

  plan.source = device_from_dl(dl.device);
  DLASYNC_RETURN_IF_ERROR(ruled("source_device", registry.check_device(plan.source, "source")));
  plan.target = options.target.value_or(plan.source);
  if (options.target) {
    DLASYNC_RETURN_IF_ERROR(ruled("target_device", registry.check_device(plan.target, "target")));
  }
  DLASYNC_RETURN_IF_ERROR(ruled("stream", check_stream(options, plan.source, registry)));
  if (plan.source.kind != device_kind::cpu) {
    plan.producer_stream = options.stream.value_or(stream_no_sync);
  }
  if (options.consumer_stream && *options.consumer_stream != stream_no_sync) {
    const std::int64_t c = *options.consumer_stream;
    if (plan.target.kind != device_kind::cuda) {
      return ruled("consumer_stream",
                   absl::InvalidArgumentError(absl::StrCat(
                       "consumer_stream ", c, " was given for target ", plan.target.name(),
                       ", which has no streams; it applies to GPU targets only")));
    }
    if (c == 0 || c < stream_no_sync) {
      return ruled(
          "consumer_stream",
          absl::InvalidArgumentError(absl::StrCat(
              "consumer_stream ", c, " is not a DLPack stream value; use 1 or a stream handle")));
    }
    if (c == stream_per_thread_default) {
      // The wait is enqueued once the copy is, often on another thread
      // (a worker, the CUDA reactor), whose per-thread stream is not the
      // caller's.
      return ruled(
          "consumer_stream",
          absl::InvalidArgumentError(
              "consumer_stream 2 (the per-thread default stream) names the stream of whichever "
              "thread makes the CUDA call, and the import enqueues its wait later, on another "
              "thread; pass a stream handle of your own (gpu_stream::dlpack_stream())"));
    }
    plan.consumer_stream = c;
  }

  DLASYNC_RETURN_IF_ERROR(ruled("strides", check_strides(dl, plan.type, plan.byte_size, plan)));
  DLASYNC_RETURN_IF_ERROR(ruled("address", check_address(dl, plan)));

  // The target's real requirement: the element size (a byte for packed
  // sub-byte data), or more when the caller asks; never DLPack's 256.
  plan.alignment = std::max<std::size_t>(plan.type.is_sub_byte() ? 1 : plan.type.bits / 8,
                                         options.min_alignment);

  std::uint8_t reasons = 0;
  auto add = [&reasons](copy_reason r) { reasons |= static_cast<std::uint8_t>(r); };
  if (options.copy.value_or(false) && (plan.flags & flag_is_copied) == 0) {
    add(copy_reason::requested);
  }
  if (detail::memory_space(plan.source) != detail::memory_space(plan.target)) {
    add(copy_reason::cross_device);
  }
  if (plan.element_count > 0 && plan.address % plan.alignment != 0) add(copy_reason::alignment);
  if (options.require_contiguous && !plan.compact) add(copy_reason::contiguity);
  if (options.require_writable && plan.read_only) add(copy_reason::writable);
  if (plan.target.kind == device_kind::cuda_host && plan.source.kind == device_kind::cpu) {
    add(copy_reason::page_locked);
  }
  plan.copy_reasons = reasons;

  if (plan.needs_copy() && options.copy == false) {
    return ruled("copy",
                 absl::FailedPreconditionError(
                     absl::StrCat("copy=false, but importing from ", device_pair(plan),
                                  " needs a copy: ", plan.copy_reason_text(),
                                  "; allow a copy (copy unset or true) or change the request")),
                 &plan);
  }
  if (plan.needs_copy() && !registry.find(plan.target.kind)->allocates) {
    return ruled("placement",
                 absl::UnimplementedError(absl::StrCat(
                     "the import needs a copy (", plan.copy_reason_text(),
                     ") but this build cannot place copies in ", device_kind_name(plan.target.kind),
                     " memory; pass a target such as ", host_device.name())),
                 &plan);
  }
  return absl::OkStatus();
}

}  // namespace detail

absl::StatusOr<import_plan> plan_import(const managed_tensor& tensor, const import_options& options,
                                        const device_registry& registry) {
  import_plan plan;
  DLASYNC_RETURN_IF_ERROR(detail::plan_import_into(tensor, options, registry, plan));
  return plan;
}

absl::Status validate_dlpack(const managed_tensor& tensor, const import_options& options,
                             const device_registry& registry) {
  return plan_import(tensor, options, registry).status();
}

}  // namespace dlasync
