// dlasync/dlpack_stream.hpp
//
// DLPack's stream values: how `__dlpack__(stream=...)` and dlasync's import
// options name a CUDA stream. A value is an integer: -1 asks for no
// synchronization (the caller orders the work), 1 is CUDA's legacy default
// stream, 2 its per-thread default stream, and any other positive value is
// a `cudaStream_t` cast to an integer. 0 is ambiguous in DLPack and refused.
//
// Example:
//
//   dlasync::import_options o;
//   o.stream = reinterpret_cast<std::int64_t>(producer_stream);  // a cudaStream_t
//   o.consumer_stream = dlasync::stream_legacy_default;
#pragma once

#include <cstdint>

namespace dlasync {

// No synchronization: the caller has ordered the producer's work already.
inline constexpr std::int64_t stream_no_sync = -1;

// CUDA's legacy default stream.
inline constexpr std::int64_t stream_legacy_default = 1;

// CUDA's per-thread default stream of the calling thread.
inline constexpr std::int64_t stream_per_thread_default = 2;

}  // namespace dlasync
