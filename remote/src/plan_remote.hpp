// Validation of a remote descriptor (internal): the checks of a local
// import, before any byte moves.
//
// `plan_remote` describes the remote tensor to plan_import as a tensor of
// this process's host memory at the exporter's address (validation never
// reads data, so the address is only a number), which checks version,
// dtype, shape, strides, byte offset, alignment and every overflow exactly
// as for a local tensor, against the caller's options. It then adds what
// only a remote tensor has: the exporter's device must be host memory, the
// bytes the strides reach must lie inside the region, the exporter must be
// named by an address and a port, copy=false and producer streams are
// refused. Every refusal carries an import_error (consumed = false).
//
// The pieces an exporter sends (protocol.hpp) are laid out here too, so
// that both sides compute them from a description the same way: the
// exporter from its own, the importer from the descriptor, which checks
// every piece that arrives against its own walk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "dlasync/device_registry.hpp"
#include "dlasync/import_options.hpp"
#include "dlasync/remote.hpp"
#include "dlasync/validate.hpp"
#include "remote/src/protocol.hpp"

namespace dlasync::remote_detail {

struct remote_plan {
  // plan_import's verdict; `target` is where the tensor lands, `address`
  // the first element's address in the exporter's process.
  import_plan plan;
  // The bytes the strides reach, in the exporter's address space.
  std::uint64_t span_begin = 0;
  std::uint64_t span_bytes = 0;
};

absl::StatusOr<remote_plan> plan_remote(const remote_descriptor& d, const import_options& options,
                                        const device_registry& registry);

// Whether `b`'s members' indices rise and lie below the count published:
// InvalidArgument naming the first member that breaks the rule. Both a
// decoded bundle and one an importer made are held to it.
absl::Status check_member_indices(const remote_bundle& b);

// `s` with "bundle member `i` of `n`: " before its message, its payloads
// (the import_error) kept.
absl::Status for_member(const absl::Status& s, std::size_t i, std::size_t n);

// What `d` says of the tensor's bytes (dtype, shape, strides, byte offset,
// data address), hashed: a hold request carries the importer's, the
// exporter compares it with its own.
std::uint64_t description_digest(const remote_descriptor& d);

// How an importer fetches a validated remote tensor: the exporter's pieces
// (active messages) into a compact buffer, or, between trusted peers, RMA
// gets of its runs, or of its whole span, compacted here afterwards.
struct fetch_choice {
  bool rma = false;
  bool span = false;        // RMA of the span, compacted here
  std::uint64_t bytes = 0;  // what lands here: the compact bytes, or the span
};

// The fetch for `d` (validated as `p`) under the node's `mode`: RMA where
// the mode says so, or, automatically, between trusted peers when the
// descriptor carries a key and the connection reads with a lane of its own
// (`native_rma`, asked only then: it reads UCX's report of the endpoint). A
// strided RMA fetch reads runs of at least `min_run_bytes` (0: 4 KiB), else
// the span. FailedPrecondition (not consumed) when RMA is forced and the
// descriptor carries no key.
absl::StatusOr<fetch_choice> choose_fetch(const remote_descriptor& d, const remote_plan& p,
                                          remote_fetch mode, bool trusted,
                                          absl::FunctionRef<bool()> native_rma,
                                          std::uint64_t min_run_bytes);

// A strided tensor is sent run by run when there are at most this many runs,
// and, unless remote_node_options::min_run_bytes says otherwise, when they
// are at least this long (docs/remote.md).
inline constexpr std::uint64_t max_runs = std::uint64_t{1} << 16;
// By default: over shared memory, runs of 16 KiB up to the largest piece
// sent eagerly (longer ones go by UCX's rendezvous, which copies through
// shared memory, and lost to the gathered copy); over a network, from
// 256 KiB up.
inline constexpr std::uint64_t default_min_sent_run_bytes_memory = std::uint64_t{16} << 10;
inline constexpr std::uint64_t default_min_sent_run_bytes_network = std::uint64_t{256} << 10;
// remote_fetch::automatic reads by RMA only imports of at least this many
// bytes, unless remote_node_options::min_rma_bytes says otherwise.
inline constexpr std::uint64_t default_min_rma_bytes = std::uint64_t{16} << 20;

// How an exporter sends the tensor `d` (validated as `p`): whole when
// compact, dense when its span holds each element once in another order,
// runs when its contiguous runs are `min_run` to `max_run` bytes long and
// at most max_runs, gathered otherwise.
piece_plan choose_plan(const remote_descriptor& d, const remote_plan& p, std::uint64_t min_run,
                       std::uint64_t max_run = UINT64_MAX);

// The pieces of a plan: piece i is `length` bytes read at `source` in the
// exporter's address space (for gathered pieces, at that offset of the
// exporter's own copy) and written at `offset` of the importer's buffer,
// which holds p.plan.byte_size bytes.
struct piece_range {
  std::uint64_t source = 0;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};
class piece_walk {
 public:
  // Whether `plan` can send `d`: every plan but none, and runs only where
  // the tensor has runs.
  static bool fits(const remote_descriptor& d, const remote_plan& p, piece_plan plan);
  // Requires fits(d, p, plan).
  piece_walk(const remote_descriptor& d, const remote_plan& p, piece_plan plan);
  piece_plan plan() const noexcept { return plan_; }
  std::uint64_t count() const noexcept { return count_; }
  // Requires i < count(); O(ndim).
  piece_range at(std::uint64_t i) const;

 private:
  piece_plan plan_;
  std::uint64_t count_ = 0;
  std::uint64_t first_ = 0;  // the first element's address
  std::uint64_t span_begin_ = 0;
  std::uint64_t bytes_ = 0;  // whole, dense, gathered: the bytes cut; runs: a run
  std::uint64_t elem_ = 0;
  std::vector<std::int64_t> outer_shape_;
  std::vector<std::int64_t> outer_strides_;
};

}  // namespace dlasync::remote_detail
