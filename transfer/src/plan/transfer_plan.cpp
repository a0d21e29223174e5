#include "transfer/src/plan/transfer_plan.hpp"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "dlasync/validate.hpp"
#include "runtime/src/budget_wait.hpp"
#include "transfer/src/kernels/strided_copy.hpp"
#include "transfer/src/validate/layout.hpp"

namespace dlasync::detail {
namespace {

absl::Status wrong_device(const import_plan& plan, const std::optional<device>& actual) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the tensor says it lives on ", plan.source.name(), " but its data pointer ",
      absl::Hex(plan.address), " is ",
      actual ? absl::StrCat("memory of ", actual->name()) : std::string("not CUDA device memory"),
      "; the producer exported a wrong device: fix its DLDevice"));
}

// Where the CUDA runtime says the first element lies.
absl::StatusOr<std::optional<device>> locate(pointer_query query, const import_plan& plan) {
  absl::StatusOr<std::optional<device>> where = query(first_element(plan));
  if (!where.ok()) {
    return absl::Status(where.status().code(),
                        absl::StrCat("cannot tell where the data of a tensor on ",
                                     plan.source.name(), " lives: ", where.status().message()));
  }
  return where;
}

// The path, with the pointer queries that check GPU memory lies where the
// tensor says and tell pinned host memory from pageable.
absl::StatusOr<transfer_path> choose_path(const transfer_facts& facts, const import_plan& plan) {
  const bool gpu_source = is_gpu_memory(plan.source.kind);
  const bool ask = facts.locate.has_value() && plan.element_count > 0;
  if (gpu_source && ask) {
    absl::StatusOr<std::optional<device>> where = locate(*facts.locate, plan);
    if (!where.ok()) return where.status();
    if (*where != plan.source) return wrong_device(plan, *where);
  }
  if (!plan.needs_copy()) {
    return plan.needs_wait() ? transfer_path::view_after_producer : transfer_path::view;
  }
  if (!gpu_source) {
    if (plan.target.kind != device_kind::cuda) return transfer_path::host_to_host;
    // Bound for a GPU: page-locked memory can go in one copy.
    bool pinned = false;
    if (ask) {
      absl::StatusOr<std::optional<device>> where = locate(*facts.locate, plan);
      if (!where.ok()) return where.status();
      if (*where && is_gpu_memory((*where)->kind)) return wrong_device(plan, *where);
      pinned = where->has_value();
    }
    return pinned && plan.compact ? transfer_path::pinned_to_gpu : transfer_path::pageable_to_gpu;
  }
  if (plan.target.kind != device_kind::cuda) return transfer_path::gpu_to_host;
  return plan.target.ordinal == plan.source.ordinal ? transfer_path::within_gpu
                                                    : transfer_path::gpu_to_gpu;
}

// Whether every unit of a strided upload fits a staging chunk: units are
// alike but for the shorter last one of a split row, so the first is the
// largest. Only a tiled copy has units it cannot cut below a row of its
// tile dimension.
bool upload_fits(const strided_layout& layout, std::uint64_t bytes, std::uint64_t chunk_bytes) {
  const strided_copy copy(layout, staging_piece_bytes(bytes, chunk_bytes));
  const std::int64_t units = copy.units();
  if (units == 0) return true;
  return copy.dst_offset(1) - copy.dst_offset(0) <= chunk_bytes &&
         copy.dst_offset(units) - copy.dst_offset(units - 1) <= chunk_bytes;
}

}  // namespace

absl::Status plan_transfer(const transfer_facts& facts, const import_plan& plan, const DLTensor& dl,
                           transfer_plan& out) {
  absl::StatusOr<transfer_path> path = choose_path(facts, plan);
  if (!path.ok()) return refused(path.status(), "location", &plan);
  out.path = *path;
  out.stream_device = out.path == transfer_path::gpu_to_host
                          ? device{device_kind::cuda, plan.source.ordinal}
                          : plan.target;
  if (out.path == transfer_path::view || out.path == transfer_path::view_after_producer) {
    return absl::OkStatus();
  }
  out.hold_bytes = plan.byte_size;
  simplified_layout(dl, plan, out.layout);
  if (out.path == transfer_path::pageable_to_gpu &&
      !upload_fits(out.layout, plan.byte_size, facts.chunk_bytes)) {
    return refused(absl::UnimplementedError(absl::StrCat(
                       "a single row of this strided ", plan.source.name(),
                       " source is larger than a staging chunk of ", facts.chunk_bytes,
                       " bytes; the tensor was not consumed: raise "
                       "runtime_options::staging_chunk_bytes or make the source contiguous first")),
                   "staging", &plan);
  }
  if (absl::Status st = within_budget("a copy", out.hold_bytes, facts.budget_limit,
                                      "import a view (copy unset, same device)");
      !st.ok()) {
    return refused(std::move(st), "budget", &plan);
  }
  return absl::OkStatus();
}

absl::Status check_budget(absl::string_view what, std::uint64_t bytes, std::uint64_t limit,
                          absl::string_view also) {
  absl::Status over = within_budget(what, bytes, limit, also);
  return over.ok() ? over : refused(std::move(over), "budget");
}

absl::Status refused(absl::Status status, const char* rule, const import_plan* plan) {
  import_error e = import_error_of(status).value_or(import_error{});
  e.consumed = false;
  if (e.rule.empty()) e.rule = rule;
  if (plan != nullptr) e.copy_reasons = plan->copy_reason_names();
  return with_import_error(std::move(status), e);
}

void simplified_layout(const DLTensor& dl, const import_plan& plan, strided_layout& out) {
  out.shape.clear();
  out.strides.clear();
  out.element_size = plan.type.is_sub_byte() ? 1 : plan.type.bits / 8u;
  if (plan.element_count == 0) {
    out.shape.push_back(0);
    out.strides.push_back(1);
    return;
  }
  if (plan.compact) {  // packed sub-byte data is compact: plain bytes
    out.shape.push_back(plan.type.is_sub_byte() ? static_cast<std::int64_t>(plan.byte_size)
                                                : plan.element_count);
    out.strides.push_back(1);
    return;
  }
  for (std::int32_t i = 0; i < dl.ndim; ++i) push_simplified(out, dl.shape[i], dl.strides[i]);
  end_simplified(out);
}

std::uint64_t staging_piece_bytes(std::uint64_t bytes, std::uint64_t chunk_bytes) noexcept {
  constexpr std::uint64_t min_pieces = 8;
  return std::clamp<std::uint64_t>(bytes / min_pieces,
                                   std::min<std::uint64_t>(256 << 10, chunk_bytes), chunk_bytes);
}

int producer_gpu(const import_plan& plan) noexcept {
  if (is_gpu_memory(plan.source.kind)) return plan.source.ordinal;
  return plan.target.kind == device_kind::cuda ? plan.target.ordinal : 0;
}

}  // namespace dlasync::detail
