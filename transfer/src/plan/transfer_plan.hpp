// The transfer plan (internal): every decision about how an import moves
// its bytes, made once, before anything is consumed, from validation's
// import_plan and a few facts about this runtime. The copy engine
// (transfer/src/copy/) carries a plan out; it decides nothing again.
//
//   path                 from            to     how (transfer/src/copy/)
//   view                 anywhere        same   no work: the producer's memory as it is
//   view_after_producer  GPU, pinned     same   the view once the producer's stream got there
//   host_to_host         host            cpu:N  strided copy on the workers (host_copy.cpp)
//   pinned_to_gpu        compact pinned  GPU    one cudaMemcpyAsync (device_copy.cpp)
//   pageable_to_gpu      other host      GPU    gathered into pinned chunks, uploaded
//                                               (device_copy.cpp, staging_pipeline.cpp)
//   gpu_to_host          GPU, managed    cpu:N  compacted on the GPU when strided, then
//                                               downloaded through pinned chunks
//   within_gpu           GPU, managed    same   cudaMemcpyAsync, or the gather kernel
//                        GPU                    when strided (device_copy.cpp, gather.cpp)
//   gpu_to_gpu           GPU, managed    peer   compacted on the source GPU when strided,
//                                               then copied across (device_copy.cpp)
//
// The refusals made here, each with its import_error rule, the tensor not
// consumed: "location" (GPU memory that is not where the tensor says, or a
// failed pointer query), "staging" (a strided upload whose row is larger
// than a staging chunk), "budget" (a copy larger than the whole copy
// budget; check_budget, which batches and remote imports use too).
//
// Thread safety: pure functions; the pointer query is the caller's.
#pragma once

#include <cstdint>
#include <optional>
#include "absl/strings/string_view.h"

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dlasync/device.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/validate.hpp"
#include "transfer/src/layout/strided_layout.hpp"

namespace dlasync::detail {

enum class transfer_path : std::uint8_t {
  view,
  view_after_producer,
  host_to_host,
  pinned_to_gpu,
  pageable_to_gpu,
  gpu_to_host,
  within_gpu,
  gpu_to_gpu,
};

// Where the CUDA runtime says an address lies: a GPU, its managed memory,
// pinned host memory; nothing for memory CUDA does not know. The failure of
// the query itself is its status.
using pointer_query = absl::FunctionRef<absl::StatusOr<std::optional<device>>(const void*)>;

// What the plan needs to know of the runtime, and nothing more.
struct transfer_facts {
  // The CUDA backend's pointer query, which the caller keeps alive while
  // it plans (a function reference); nothing without a CUDA backend.
  std::optional<pointer_query> locate;
  // The bytes of a staging chunk (the CUDA backend's); 0 without one.
  std::uint64_t chunk_bytes = 0;
  // The whole copy memory budget; 0: unlimited.
  std::uint64_t budget_limit = 0;
};

struct transfer_plan {
  transfer_path path = transfer_path::view;
  // How the copy reads the source, simplified (the layout floor); empty for
  // the views, which read nothing.
  strided_layout layout;
  // The copy budget the import holds while it copies: the compact bytes;
  // 0 for the views.
  std::uint64_t hold_bytes = 0;
  // The device whose streams carry the work: the source GPU for
  // downloads, else the target.
  device stream_device;
};

// Plans the import of `dl`, which validation accepted as `plan`, into
// `out` (an import plans into its own start, without moving a returned
// plan on the fast path). A refusal carries its rule and the plan's copy
// reasons; nothing is consumed either way.
absl::Status plan_transfer(const transfer_facts& facts, const import_plan& plan, const DLTensor& dl,
                           transfer_plan& out);

// `status` as a refusal by `rule` (dlasync/validate.hpp's import_error),
// the tensor not consumed, with `plan`'s copy reasons when given; a rule
// that validation named already is kept.
absl::Status refused(absl::Status status, const char* rule, const import_plan* plan = nullptr);

// ResourceExhausted (rule "budget", not consumed) when `bytes`, what
// `what` needs ("a copy", "the batch's copies together", "the remote
// tensor"), exceed a budget `limit` (0: unlimited). `also` is what else the
// caller could do, appended to the advice, or empty.
absl::Status check_budget(absl::string_view what, std::uint64_t bytes, std::uint64_t limit,
                          absl::string_view also = {});

// How a copy reads the source `dl` that `plan` accepted, simplified (the
// layout floor's rule), written into `out` in one pass: packed sub-byte
// data and compact tensors as one run, else the tensor's strides.
void simplified_layout(const DLTensor& dl, const import_plan& plan, strided_layout& out);

// The bytes one staging chunk carries for a transfer of `bytes`: a whole
// chunk, but a transfer of less than eight chunks is cut into eight pieces
// (of 256 KiB at least), so that gathering, the link and the copy out
// overlap for it too: with one piece they would take turns.
std::uint64_t staging_piece_bytes(std::uint64_t bytes, std::uint64_t chunk_bytes) noexcept;

// The GPU whose streams the special producer stream values (1, 2) name:
// the source's GPU, else the target GPU, else GPU 0 (pinned memory copied
// to the host: DLPack's kDLCUDAHost names no GPU).
int producer_gpu(const import_plan& plan) noexcept;

}  // namespace dlasync::detail
