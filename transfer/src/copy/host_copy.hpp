// Host-to-host copies (internal): a strided host source gathered into a
// compact host destination on a host stream, the copy split across the
// worker pool when large. A page-locked source written on a CUDA stream is
// copied once that stream reached the import.
#pragma once

#include "runtime/src/backend.hpp"
#include "runtime/src/completion_marker.hpp"
#include "runtime/src/runtime_core.hpp"
#include "transfer/src/copy/transfer_path.hpp"

namespace dlasync::detail {

// Runs `request` (path host_to_host) on host stream `s`. The marker
// completes when the copy has finished, or stopped early on cancellation
// (request.control->aborted then says so).
marker_ptr copy_on_host(runtime_core& core, stream_ref s, copy_request request);

}  // namespace dlasync::detail
