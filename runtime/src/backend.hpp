// The backend seam (internal): what a device backend does for the runtime.
// The host backend serves CPU memory and reads pinned CUDA host memory; the
// CUDA backend serves GPUs, real or simulated. A backend announces the
// device kinds it serves (for the registry) and allocates on them; moving
// bytes is the transfer layer's job (transfer/src/copy/), which uses each
// backend's own streams.
//
// Ordering on a backend's streams means the same everywhere:
//   - a stream is an in-order queue of work on one device: work enqueued on
//     it starts after everything enqueued before it has completed;
//   - a marker recorded on a stream completes when all work enqueued before
//     it on that stream has completed;
//   - nothing blocks the calling thread on device work.
//
// A backend is owned by a runtime and shared by its imports.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "dlasync/device.hpp"
#include "dlasync/device_buffer.hpp"
#include "dlasync/device_registry.hpp"

namespace dlasync {

// A shared cell that says on which stream a stream-ordered buffer is freed
// (DLPack stream encoding): the buffer reads it, the tensor that holds the
// buffer may change it (tensor::set_stream).
using free_stream_cell = std::shared_ptr<std::atomic<std::int64_t>>;

// A slot of a device's stream pool, not a stream: `index` modulo the
// device's stream count, resolved by the backend that owns the pool (a
// stream handle that does not own its stream would be a `_ref`, as CCCL's
// cuda::stream_ref).
struct stream_slot {
  dlasync::device device;
  int index = 0;
};

class backend {
 public:
  virtual ~backend() = default;

  virtual const char* name() const noexcept = 0;

  // The device kinds this backend serves, for the registry.
  virtual std::vector<served_devices> served() const = 0;

  // Allocates `bytes` on `d`, aligned to `alignment` bytes (a power of two),
  // in the order of stream `s` where the device orders allocations.
  // ResourceExhausted when the device is out of memory. Where memory is
  // freed stream-ordered, `free_stream` (when given) is set to the stream
  // (DLPack encoding) and read when the buffer is freed: the tensor's
  // set_stream moves the free onto the caller's stream.
  virtual absl::StatusOr<device_buffer> allocate(device d, std::uint64_t bytes,
                                                 std::size_t alignment, stream_slot s,
                                                 const free_stream_cell& free_stream) = 0;

  // Returns once no completion callback that was running on a thread of the
  // backend's own (the CUDA reactor) at the time of the call is still
  // running. The runtime calls it at shutdown, after every import ended and
  // before its thread pools go: the callback that handed an import's last
  // piece of work to a pool may still be returning from that call.
  virtual void quiesce() {}
};

}  // namespace dlasync
