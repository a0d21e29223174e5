// dlasync/runtime/backend.hpp
//
// The backend seam: what a device backend does for the runtime. The host
// backend implements it for CPU memory; the CUDA backend implements the same
// interface with CUDA streams and events. Imports are written against this
// interface only, so ordering means the same on every backend:
//
//   - a stream is an in-order queue of work on one device: work enqueued on
//     it starts after everything enqueued before it has completed;
//   - `record` enqueues a completion marker that completes when all work
//     enqueued before it on that stream has completed;
//   - `wait` makes a stream hold the work enqueued after it until a marker
//     (from any stream) completes;
//   - no call blocks the calling thread on device work.
//
// A backend is owned by a runtime and shared by its imports.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "dlasync/runtime/completion_marker.hpp"
#include "dlasync/runtime/device.hpp"
#include "dlasync/runtime/device_buffer.hpp"
#include "dlasync/runtime/device_registry.hpp"
#include "dlasync/runtime/strided_copy.hpp"

namespace dlasync {

// One stream of one device.
struct stream_ref {
  dlasync::device device;
  int index = 0;
};

// Lets an import stop a copy that has not finished. The copy checks
// `cancel_requested` between pieces and sets `aborted` when it stopped early
// (the destination is then incomplete).
struct copy_control {
  std::atomic<bool> cancel_requested{false};
  std::atomic<bool> aborted{false};
};

// DLPack's stream value for "no producer stream: the caller orders".
inline constexpr std::int64_t no_producer_stream = -1;

// A copy of a strided source into a compact row-major destination.
struct copy_job {
  device source_device;
  device target_device;
  const void* source = nullptr;  // the first element
  void* destination = nullptr;
  strided_layout layout;
  // The producer's stream (DLPack encoding) that the copy's reads must
  // follow, or no_producer_stream.
  std::int64_t producer_stream = no_producer_stream;
  std::shared_ptr<copy_control> control;
};

class backend {
 public:
  virtual ~backend() = default;

  virtual const char* name() const noexcept = 0;

  // The device kinds this backend serves, for the registry.
  virtual std::vector<served_devices> served() const = 0;

  // The streams each device of `kind` has; at least 1.
  virtual int stream_count(device d) const noexcept = 0;

  // Allocates `bytes` on `d`, aligned to `alignment` bytes (a power of two),
  // in the order of stream `s` where the device orders allocations.
  // ResourceExhausted when the device is out of memory.
  virtual absl::StatusOr<device_buffer> allocate(device d, std::uint64_t bytes,
                                                 std::size_t alignment, stream_ref s) = 0;

  // Enqueues `job` on `s` and returns a marker that completes, with the
  // copy's status, when the copy has finished reading the source and
  // writing the destination (host-side stages of a pipeline included).
  virtual marker_ptr enqueue_copy(stream_ref s, copy_job job) = 0;

  // Enqueues a marker on `s` and returns it.
  virtual marker_ptr record(stream_ref s) = 0;

  // Holds the work enqueued on `s` after this call until `m` completes.
  // Unimplemented when `s` cannot wait for `m` without blocking (a device
  // stream and a pending marker of another backend).
  virtual absl::Status wait(stream_ref s, marker_ptr m) = 0;

  // The device that owns `pointer`, when the backend can tell.
  // Empty when the pointer is memory no backend device owns (pageable host
  // memory); the failure of the query itself as its status.
  virtual absl::StatusOr<std::optional<device>> device_of(const void* pointer) const = 0;

  // Makes the caller's stream `consumer_stream` (DLPack encoding) of device
  // `d` wait on the device for `m`, so that work the caller enqueues there
  // follows without a host round trip. Unimplemented when `m` cannot be
  // waited for on the device (the caller then waits on the host).
  virtual absl::Status order_consumer(device d, std::int64_t consumer_stream,
                                      const marker_ptr& m) = 0;

  // A marker that completes when the producer's stream `producer_stream`
  // (DLPack encoding) on device `d` reaches the point of this call.
  // Backends without streams return a completed marker.
  virtual marker_ptr record_producer(device d, std::int64_t producer_stream) = 0;

  // Returns once no completion callback that was running on a thread of the
  // backend's own (the CUDA reactor) at the time of the call is still
  // running. The runtime calls it at shutdown, after every import ended and
  // before its thread pools go: the callback that handed an import's last
  // piece of work to a pool may still be returning from that call.
  virtual void quiesce() {}
};

}  // namespace dlasync
