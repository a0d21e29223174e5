// libFuzzer target: remote descriptors and bundles as they arrive from
// another process (untrusted bytes), through decode and the remote import's
// validation (plan_remote, each bundle member as one descriptor), against a
// runtime with two host devices.
//
// What must hold for every input (else the target traps):
//   - decode either refuses with InvalidArgument or OutOfRange, or gives a
//     descriptor (a bundle) that encodes back to exactly the input, and a
//     bundle's members have rising indices below the count published and
//     the bundle's lease and exporter;
//   - validation either refuses with an import_error that says "not
//     consumed" and names a rule, or accepts a tensor whose every byte lies
//     inside the region, with an exporter's address and port;
//   - every piece plan that fits the tensor cuts pieces that lie inside
//     the importer's buffer and, read from the exporter, inside the span
//     (the first and last 32 pieces of each plan are checked);
//   - nothing reads the tensor's (fake) address: ASan would report it;
//   - no sanitizer report, no hang.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "dlasync/dlasync.hpp"
#include "dlasync/remote.hpp"
#include "remote/src/plan_remote.hpp"

namespace {

using namespace dlasync;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_descriptor: %s\n", what);
  __builtin_trap();
}

runtime& the_runtime() {
  static std::unique_ptr<runtime> rt = [] {
    runtime_options o;
    o.worker_threads = 1;
    o.cuda = "off";
    o.topology = process_topology::single_process(2);
    absl::StatusOr<std::unique_ptr<runtime>> r = runtime::create(o);
    if (!r.ok()) fail("runtime");
    return *std::move(r);
  }();
  return *rt;
}

void check_piece(const remote_detail::piece_walk& walk, const remote_detail::remote_plan& p,
                 std::uint64_t i) {
  const remote_detail::piece_range r = walk.at(i);
  const std::uint64_t buffer = p.plan.byte_size;
  if (r.offset > buffer || r.length > buffer - r.offset) fail("a piece past the buffer");
  if (walk.plan() == remote_detail::piece_plan::gathered) return;
  if (r.source < p.span_begin || r.source - p.span_begin > p.span_bytes ||
      r.length > p.span_bytes - (r.source - p.span_begin)) {
    fail("a piece read outside the span");
  }
}

void check_pieces(const remote_descriptor& d, const remote_detail::remote_plan& p) {
  using remote_detail::piece_plan;
  for (piece_plan plan :
       {piece_plan::whole, piece_plan::dense, piece_plan::runs, piece_plan::gathered}) {
    if (!remote_detail::piece_walk::fits(d, p, plan)) continue;
    const remote_detail::piece_walk walk(d, p, plan);
    if (p.plan.element_count > 0 && walk.count() == 0) fail("a plan without pieces");
    for (std::uint64_t i = 0; i < walk.count() && i < 32; ++i) check_piece(walk, p, i);
    for (std::uint64_t i = walk.count() > 32 ? walk.count() - 32 : 0; i < walk.count(); ++i) {
      check_piece(walk, p, i);
    }
    // A whole or dense span comes in pieces of max_piece_bytes, back to
    // back, the last one ending at the span's end.
    if ((plan == piece_plan::whole || plan == piece_plan::dense) && walk.count() > 0) {
      const remote_detail::piece_range last = walk.at(walk.count() - 1);
      if (last.offset != (walk.count() - 1) * remote_detail::max_piece_bytes ||
          last.offset + last.length != p.plan.byte_size || last.length == 0 ||
          last.length > remote_detail::max_piece_bytes) {
        fail("a span's pieces do not cover it once");
      }
    }
  }
  const piece_plan chosen =
      remote_detail::choose_plan(d, p, remote_detail::default_min_sent_run_bytes_memory);
  if (!remote_detail::piece_walk::fits(d, p, chosen)) fail("the chosen plan does not fit");
}

// Validation of one decoded descriptor, with the options `knobs` picks.
void check_validation(const remote_descriptor& d, std::uint8_t knobs) {
  import_options o;
  if ((knobs & 1) != 0) o.target = device{device_kind::cpu, 1};
  if ((knobs & 2) != 0) o.copy = (knobs & 4) != 0;
  o.require_contiguous = (knobs & 8) != 0;
  o.require_writable = (knobs & 16) != 0;
  if ((knobs & 32) != 0) o.stream = static_cast<std::int64_t>(knobs);

  absl::StatusOr<remote_detail::remote_plan> plan =
      remote_detail::plan_remote(d, o, the_runtime().registry());
  if (!plan.ok()) {
    std::optional<import_error> why = import_error_of(plan.status());
    if (!why) fail("a refusal without an import_error");
    if (why->consumed) fail("a refusal that says consumed");
    return;
  }
  if (plan->plan.element_count > 0) {
    if (plan->span_begin < d.region_begin) fail("span starts before the region");
    if (plan->span_bytes > d.region_bytes ||
        plan->span_begin - d.region_begin > d.region_bytes - plan->span_bytes) {
      fail("span ends after the region");
    }
  }
  if (d.exporter_address.empty() || d.exporter_port == 0) fail("accepted without an exporter");
  check_pieces(d, *plan);
}

template <typename T>
bool decoded(const absl::StatusOr<T>& d, std::string_view bytes) {
  if (!d.ok()) {
    if (d.status().code() != absl::StatusCode::kInvalidArgument &&
        d.status().code() != absl::StatusCode::kOutOfRange) {
      fail("decode refused with an unexpected code");
    }
    return false;
  }
  if (d->encode() != bytes) fail("decode then encode is not the input");
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // Options from the last byte: target, copy, layout requirements.
  const std::uint8_t knobs = size > 0 ? data[size - 1] : 0;
  if (bytes.substr(0, 4) == "DLRB") {
    // A bundle: each member is validated as one descriptor, and carries the
    // bundle's lease and exporter.
    absl::StatusOr<remote_bundle> b = remote_bundle::decode(bytes);
    if (!decoded(b, bytes)) return 0;
    if (b->members.empty() || b->members.size() > b->published) fail("members past published");
    for (std::size_t i = 0; i < b->members.size(); ++i) {
      const remote_bundle::member& m = b->members[i];
      if (m.index >= b->published || (i > 0 && m.index <= b->members[i - 1].index)) {
        fail("member indices that do not rise below published");
      }
      if (m.descriptor.lease_id != b->lease_id || m.descriptor.exporter_port != b->exporter_port) {
        fail("a member without the bundle's lease and exporter");
      }
      check_validation(m.descriptor, knobs);
    }
    return 0;
  }
  absl::StatusOr<remote_descriptor> d = remote_descriptor::decode(bytes);
  if (!decoded(d, bytes)) return 0;
  check_validation(*d, knobs);
  return 0;
}
