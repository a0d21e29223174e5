#include "remote/src/plan_remote.hpp"

#include <string>

#include "absl/strings/str_cat.h"
#include "dlasync/transfer/import_error.hpp"
#include "dlasync/transfer/producer.hpp"

namespace dlasync::remote_detail {
namespace {

absl::Status refuse(absl::Status status, const char* rule) {
  return with_import_error(std::move(status),
                           import_error{.consumed = false, .rule = rule, .copy_reasons = ""});
}

}  // namespace

run_shape contiguous_run(const std::vector<std::int64_t>& shape,
                         const std::vector<std::int64_t>& strides, std::uint64_t elem) {
  run_shape r{0, elem};
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) {
      ++r.inner_dims;
      continue;
    }
    if (strides[i] != expected) break;
    expected *= shape[i];
    r.bytes *= static_cast<std::uint64_t>(shape[i]);
    ++r.inner_dims;
  }
  return r;
}

absl::StatusOr<remote_plan> plan_remote(const remote_descriptor& d, const import_options& options,
                                        const device_registry& registry) {
  if (options.copy.has_value() && !*options.copy) {
    return refuse(absl::FailedPreconditionError(
                      "copy=false: a remote tensor's bytes always move into this process; "
                      "leave copy unset or pass copy=true"),
                  "copy");
  }
  if (options.stream.has_value() && *options.stream != stream_no_sync) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
                      "stream=", *options.stream,
                      ": a remote tensor has no producer stream in this process; the exporter "
                      "orders its writes before it publishes. Leave stream unset")),
                  "stream");
  }
  if (!is_host_memory(d.source_device.kind)) {
    return refuse(absl::UnimplementedError(absl::StrCat(
                      "the remote tensor lives on ", d.source_device.name(),
                      " of its process; this UCX has no CUDA transports, so only host memory "
                      "(cpu, cuda_host) is fetched: have the exporter import it onto cpu:0 "
                      "and publish that")),
                  "source_device");
  }
  if (d.shape.size() != d.strides.size()) {
    return refuse(absl::InvalidArgumentError(absl::StrCat("the descriptor has ", d.shape.size(),
                                                          " extents and ", d.strides.size(),
                                                          " strides; they must match")),
                  "shape");
  }
  if (d.dlpack_major != dlpack_major_version) {
    return refuse(absl::UnimplementedError(absl::StrCat(
                      "the remote tensor is DLPack ", d.dlpack_major, ".", d.dlpack_minor,
                      "; dlasync reads major version ", dlpack_major_version)),
                  "version");
  }
  // The remote tensor, described to plan_import as memory of this process
  // at the exporter's address: nothing reads it.
  tensor_description desc;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): an address of another process, never read
  desc.data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(d.data));
  desc.device = host_device;
  desc.dtype = d.type;
  desc.shape = d.shape;
  desc.strides = d.strides;
  desc.byte_offset = d.byte_offset;
  desc.flags = d.flags;
  managed_tensor stand_in = make_managed_tensor(std::move(desc));
  import_options local = options;
  if (!local.target) local.target = host_device;
  local.copy.reset();
  local.stream.reset();
  absl::StatusOr<import_plan> plan = plan_import(stand_in, local, registry);
  if (!plan.ok()) {
    absl::Status s(plan.status().code(), absl::StrCat("remote tensor (lease ", d.lease_id,
                                                      "): ", plan.status().message()));
    if (std::optional<import_error> why = import_error_of(plan.status())) {
      return with_import_error(std::move(s), *why);
    }
    return refuse(std::move(s), "");
  }
  if (d.worker_address.empty()) {
    return refuse(absl::InvalidArgumentError(
                      "the descriptor carries no exporter address; it cannot be fetched"),
                  "remote_region");
  }
  remote_plan out;
  out.plan = *plan;
  if (plan->element_count == 0) return out;

  // The span, in the exporter's address space: plan_import bounded it.
  const std::uint64_t first = plan->address;
  const std::uint64_t begin = first + static_cast<std::uint64_t>(plan->span_begin);
  const std::uint64_t bytes = static_cast<std::uint64_t>(plan->span_end - plan->span_begin);
  std::uint64_t region_end = 0;
  if (__builtin_add_overflow(d.region_begin, d.region_bytes, &region_end) ||
      begin < d.region_begin || begin > region_end || bytes > region_end - begin) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
                      "the remote tensor's bytes [", begin, ", +", bytes,
                      ") reach outside the region the exporter registered [", d.region_begin, ", +",
                      d.region_bytes,
                      "): the descriptor is corrupt or not from dlasync; ask the exporter to "
                      "publish again")),
                  "remote_region");
  }
  if (d.rkey.empty()) {
    return refuse(absl::InvalidArgumentError(
                      "the descriptor carries no remote key for a tensor with elements"),
                  "remote_region");
  }
  out.span_begin = begin;
  out.span_bytes = bytes;
  return out;
}

}  // namespace dlasync::remote_detail
