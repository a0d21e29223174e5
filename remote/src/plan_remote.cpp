#include "remote/src/plan_remote.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "dlasync/producer.hpp"
#include "dlasync/validate.hpp"
#include "remote/src/numeric_address.hpp"
#include "transfer/src/layout/strided_layout.hpp"
#include "transfer/src/plan/transfer_plan.hpp"

namespace dlasync::remote_detail {

namespace {

using detail::innermost_run;
using detail::refused;
using detail::run_shape;

}  // namespace

absl::StatusOr<remote_plan> plan_remote(const remote_descriptor& d, const import_options& options,
                                        const device_registry& registry) {
  if (options.copy.has_value() && !*options.copy) {
    return refused(absl::FailedPreconditionError(
                       "copy=false: a remote tensor's bytes always move into this process; "
                       "leave copy unset or pass copy=true"),
                   "copy");
  }
  if (options.stream.has_value() && *options.stream != stream_no_sync) {
    return refused(absl::InvalidArgumentError(absl::StrCat(
                       "stream=", *options.stream,
                       ": a remote tensor has no producer stream in this process; the exporter "
                       "orders its writes before it publishes. Leave stream unset")),
                   "stream");
  }
  if (!is_host_memory(d.source_device.kind)) {
    return refused(absl::UnimplementedError(absl::StrCat(
                       "the remote tensor lives on ", d.source_device.name(),
                       " of its process; this UCX has no CUDA transports, so only host memory "
                       "(cpu, cuda_host) is fetched: have the exporter import it onto cpu:0 "
                       "and publish that")),
                   "source_device");
  }
  if (d.shape.size() != d.strides.size()) {
    return refused(absl::InvalidArgumentError(absl::StrCat("the descriptor has ", d.shape.size(),
                                                           " extents and ", d.strides.size(),
                                                           " strides; they must match")),
                   "shape");
  }
  if (d.dlpack_major != dlpack_major_version) {
    return refused(absl::UnimplementedError(absl::StrCat(
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
    return refused(std::move(s), "");
  }
  if (d.exporter_address.empty() || d.exporter_port == 0) {
    return refused(absl::InvalidArgumentError(absl::StrCat(
                       "the descriptor names no exporter to fetch from (address \"",
                       d.exporter_address, "\", port ", d.exporter_port,
                       "); it is corrupt, or its node does not listen (remote_node_options::"
                       "listen_address)")),
                   "remote_region");
  }
  if (is_wildcard_address(d.exporter_address)) {
    return refused(
        absl::InvalidArgumentError(absl::StrCat(
            "the descriptor names the exporter at ", d.exporter_address,
            ", the wildcard address, which names no host to connect to: its node listens on "
            "every interface; give that node remote_node_options::advertised_address, the "
            "address importers reach it at")),
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
    return refused(absl::InvalidArgumentError(absl::StrCat(
                       "the remote tensor's bytes [", begin, ", +", bytes,
                       ") reach outside the region the exporter registered [", d.region_begin,
                       ", +", d.region_bytes,
                       "): the descriptor is corrupt or not from dlasync; ask the exporter to "
                       "publish again")),
                   "remote_region");
  }
  out.span_begin = begin;
  out.span_bytes = bytes;
  return out;
}

absl::Status check_member_indices(const remote_bundle& b) {
  for (std::size_t i = 0; i < b.members.size(); ++i) {
    const std::uint32_t index = b.members[i].index;
    if (index < b.published && (i == 0 || index > b.members[i - 1].index)) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("remote bundle, member ", i, ": index ", index, " after ",
                     i > 0 ? absl::StrCat(b.members[i - 1].index) : std::string("none"), " of ",
                     b.published, " published; indices rise and lie below the count published"));
  }
  return absl::OkStatus();
}

absl::Status for_member(const absl::Status& s, std::size_t i, std::size_t n) {
  absl::Status out(s.code(), absl::StrCat("bundle member ", i, " of ", n, ": ", s.message()));
  s.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

std::uint64_t description_digest(const remote_descriptor& d) {
  // FNV-1a over the fields, little-endian: a check of agreement between
  // honest peers, not a secret.
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  };
  mix(d.type.code);
  mix(d.type.bits);
  mix(d.type.lanes);
  mix(d.shape.size());
  for (std::int64_t e : d.shape) mix(static_cast<std::uint64_t>(e));
  for (std::int64_t e : d.strides) mix(static_cast<std::uint64_t>(e));
  mix(d.byte_offset);
  mix(d.data);
  return h;
}

namespace {

run_shape contiguous_run(const remote_descriptor& d) {
  return innermost_run(d.shape, d.strides, d.type.padded_size());
}

bool fills_span(const remote_descriptor& d) {
  return detail::fills_span(d.shape, d.strides);
}

}  // namespace

piece_plan choose_plan(const remote_descriptor& d, const remote_plan& p, std::uint64_t min_run,
                       std::uint64_t max_run) {
  if (p.plan.element_count == 0 || p.plan.compact) return piece_plan::whole;
  if (!d.type.is_sub_byte() && fills_span(d)) return piece_plan::dense;
  if (piece_walk::fits(d, p, piece_plan::runs)) {
    const run_shape run = contiguous_run(d);
    if (run.bytes >= min_run && run.bytes <= max_run) return piece_plan::runs;
  }
  return piece_plan::gathered;
}

absl::StatusOr<fetch_choice> choose_fetch(const remote_descriptor& d, const remote_plan& p,
                                          remote_fetch mode, bool trusted,
                                          absl::FunctionRef<bool()> native_rma,
                                          std::uint64_t min_run_bytes) {
  fetch_choice out;
  switch (mode) {
    case remote_fetch::automatic: out.rma = trusted && !d.rkey.empty() && native_rma(); break;
    case remote_fetch::rma: out.rma = true; break;
    case remote_fetch::active_messages: out.rma = false; break;
  }
  if (p.plan.element_count == 0) return out;
  if (out.rma && d.rkey.empty()) {
    return refused(absl::FailedPreconditionError(
                       "remote_node_options::fetch = rma, but the descriptor carries no remote "
                       "key: its exporter does not trust its peers with RMA; use "
                       "remote_fetch::automatic"),
                   "remote_region");
  }
  out.bytes = p.plan.byte_size;
  if (out.rma && !p.plan.compact) {
    const std::uint64_t min_run = min_run_bytes != 0 ? min_run_bytes : 4096;
    if (!piece_walk::fits(d, p, piece_plan::runs) || contiguous_run(d).bytes < min_run) {
      out.span = true;
      out.bytes = p.span_bytes;
    }
  }
  return out;
}

bool piece_walk::fits(const remote_descriptor& d, const remote_plan& p, piece_plan plan) {
  switch (plan) {
    case piece_plan::whole: return p.plan.element_count == 0 || p.plan.compact;
    case piece_plan::dense:
      return p.plan.element_count > 0 && !d.type.is_sub_byte() && fills_span(d) &&
             p.span_bytes == p.plan.byte_size;
    case piece_plan::gathered: return p.plan.element_count > 0;
    case piece_plan::runs: {
      if (p.plan.element_count == 0 || d.type.is_sub_byte()) return false;
      const run_shape run = contiguous_run(d);
      return run.inner_dims < d.shape.size() && p.plan.byte_size / run.bytes <= max_runs;
    }
    case piece_plan::none: return false;
  }
  return false;
}

piece_walk::piece_walk(const remote_descriptor& d, const remote_plan& p, piece_plan plan)
    : plan_(plan), first_(p.plan.address), span_begin_(p.span_begin) {
  if (p.plan.element_count == 0) return;
  switch (plan) {
    case piece_plan::whole:
    case piece_plan::dense:
    case piece_plan::gathered:
      // The span (or the exporter's copy) in pieces of max_piece_bytes, the
      // last one shorter.
      bytes_ = p.plan.byte_size;
      count_ = bytes_ / max_piece_bytes + (bytes_ % max_piece_bytes != 0 ? 1 : 0);
      break;
    case piece_plan::runs: {
      elem_ = d.type.padded_size();
      const run_shape run = contiguous_run(d);
      const std::size_t outer = d.shape.size() - run.inner_dims;
      outer_shape_.assign(d.shape.begin(), d.shape.begin() + static_cast<std::ptrdiff_t>(outer));
      outer_strides_.assign(d.strides.begin(),
                            d.strides.begin() + static_cast<std::ptrdiff_t>(outer));
      bytes_ = run.bytes;
      count_ = p.plan.byte_size / run.bytes;
      break;
    }
    case piece_plan::none: break;
  }
}

piece_range piece_walk::at(std::uint64_t i) const {
  switch (plan_) {
    case piece_plan::whole:
    case piece_plan::dense: {
      const std::uint64_t offset = i * max_piece_bytes;
      return piece_range{span_begin_ + offset, offset, std::min(max_piece_bytes, bytes_ - offset)};
    }
    case piece_plan::gathered: {
      // From the exporter's copy: its offset is the source.
      const std::uint64_t offset = i * max_piece_bytes;
      return piece_range{offset, offset, std::min(max_piece_bytes, bytes_ - offset)};
    }
    case piece_plan::runs: {
      // Run i of the row-major walk: its outer index, last dimension
      // fastest. Validation bounded every offset.
      std::int64_t elements = 0;
      std::uint64_t rest = i;
      for (std::size_t k = outer_shape_.size(); k-- > 0;) {
        const auto extent = static_cast<std::uint64_t>(outer_shape_[k]);
        elements += static_cast<std::int64_t>(rest % extent) * outer_strides_[k];
        rest /= extent;
      }
      const std::uint64_t source =
          first_ + static_cast<std::uint64_t>(elements * static_cast<std::int64_t>(elem_));
      return piece_range{source, i * bytes_, bytes_};
    }
    case piece_plan::none: break;
  }
  return piece_range{};
}

}  // namespace dlasync::remote_detail
