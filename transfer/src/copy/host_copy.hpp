// Host-to-host copies (internal): a strided host source gathered into a
// compact host destination on a host stream, the copy split across the
// worker pool when large. A page-locked source written on a CUDA stream is
// copied once that stream reached the import.
#pragma once

#include "runtime/src/backend.hpp"
#include "runtime/src/completion_marker.hpp"
#include "transfer/src/copy/copy_services.hpp"
#include "transfer/src/copy/transfer_path.hpp"
#include "transfer/src/kernels/strided_copy.hpp"

namespace dlasync::detail {

// Runs `request` (path host_to_host) on host stream `s`. The marker
// completes when the copy has finished, or stopped early on cancellation
// (request.control->aborted then says so).
marker_ptr copy_on_host(const copy_services& with, stream_slot s, copy_request request);

// Runs `copy` from `from` (its first element) to `to` inside this call, on
// this thread, with idle workers helping when the copy is large enough to
// split (copy_services::parallel_copy_bytes). The copy is cut into slices
// that this thread and the helpers claim in turn: a helper that wakes late
// finds nothing left, and this thread never waits on a slice nobody has
// started, so it is held for at most the time the whole copy takes on one
// thread, plus one slice. It returns when every byte is written.
void copy_here(const copy_services& with, const strided_copy& copy, const void* from, void* to);

}  // namespace dlasync::detail
