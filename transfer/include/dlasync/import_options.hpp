// dlasync/import_options.hpp
//
// `dlasync::import_options` is what a caller asks of one import: where the
// tensor should land, whether it may or must be copied, on which stream the
// producer's writes are ordered, and what layout the result must have.
//
// Example:
//
//   dlasync::import_options o;
//   o.target = dlasync::device{dlasync::device_kind::cpu, 1};
//   o.copy = false;              // refuse anything that would need a copy
//   o.require_contiguous = true; // row-major, or a copy
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "dlasync/device.hpp"
#include "dlasync/dlpack_stream.hpp"
#include "dlasync/limits.hpp"

namespace dlasync {

struct import_options {
  // Where the tensor should land. Empty: the source's own device, which must
  // then be addressable and served; an import never moves data silently.
  std::optional<device> target;

  // true: always copy (a producer copy flagged IS_COPIED counts as one);
  // false: never copy, refuse when a copy is needed; empty: copy only when
  // the target, alignment, contiguity or writability ask for it.
  std::optional<bool> copy;

  // The producer's stream in DLPack's encoding (dlpack_stream.hpp): empty
  // or stream_no_sync for none (the caller orders); for CUDA memory 1
  // (legacy default), 2 (per-thread default) or a cudaStream_t; 0 is
  // ambiguous and refused. Host memory has no streams: only none is legal
  // there.
  std::optional<std::int64_t> stream;

  // The caller's stream on the target GPU (DLPack encoding). When given, the
  // import resumes as soon as its work is enqueued, and this stream waits
  // for it on the device, so the caller's kernels follow with no host round
  // trip. Transfers that end on the host (the staging pipelines) resume when
  // the data is ready instead. Empty: resume when the data is ready.
  std::optional<std::int64_t> consumer_stream;

  // The result must be compact row-major.
  bool require_contiguous = false;

  // The result must be writable: read-only sources (flag READ_ONLY, zero or
  // negative strides) are then copied.
  bool require_writable = false;

  // Bytes the first element's address must be a multiple of, a power of two.
  // 0 asks for the element size, which is always required.
  std::size_t min_alignment = 0;
};

}  // namespace dlasync
