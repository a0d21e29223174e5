// The CUDA context (internal): what the CUDA backend, the buffers it hands
// out and the transfers running on its streams share. Buffers may outlive
// the runtime, so they keep the context alive until they are freed; the
// last reference may drop on the reactor thread, in which case the context
// is destroyed on a thread of its own.
//
// It owns the CUDA runtime (real or simulated), the stream and event
// pools, the reactor, the pinned chunk pool, and memory whose free failed
// (freed again at teardown instead of lost). Its members are the stream
// primitives every GPU transfer is built from: markers recorded on
// streams, device-side waits between streams, and drains before memory is
// released on error paths.
//
// Thread safety: all members are safe from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "dlasync/device.hpp"
#include "runtime/src/completion_marker.hpp"
#include "runtime/src/cuda/chunk_pool.hpp"
#include "runtime/src/cuda/cuda_api.hpp"
#include "runtime/src/cuda/pools.hpp"
#include "runtime/src/cuda/reactor.hpp"
#include "runtime/src/handoff.hpp"

namespace dlasync::detail {

struct cuda_options {
  int streams_per_device = 2;
  // Streams per GPU that carry pipeline chunks, so that transfers in flight
  // overlap with the staging of the next chunks.
  int staging_streams = 2;
  std::uint64_t staging_chunk_bytes = 4 << 20;
  int staging_chunks = 8;
  // Where markers' callbacks run once their events complete; null runs
  // them on the reactor thread (tests of the context alone).
  std::shared_ptr<handoff> completions;
  // Counts the staging chunks in use (runtime::stats); null: uncounted
  // outside the pool.
  std::shared_ptr<std::atomic<int>> chunks_in_use;
};

// A stream of a device: what drains are given.
using device_stream = std::pair<int, cuda::stream_t>;

class cuda_context : public std::enable_shared_from_this<cuda_context> {
 public:
  // Creates the streams of the GPUs `served` marks (of all the process
  // sees) and starts the reactor.
  static absl::StatusOr<std::shared_ptr<cuda_context>> create(std::shared_ptr<cuda::api> api,
                                                              const cuda_options& options,
                                                              const std::vector<bool>& served);
  cuda_context(const cuda_context&) = delete;
  cuda_context& operator=(const cuda_context&) = delete;
  ~cuda_context();

  cuda::api& api() noexcept { return *api_; }
  const cuda_options& options() const noexcept { return options_; }
  int device_count() const noexcept { return streams_->device_count(); }
  cuda::stream_t stream(int device, int index) const { return streams_->stream(device, index); }
  const std::vector<cuda::stream_t>& staging(int device) const { return streams_->staging(device); }
  chunk_pool& chunks() noexcept { return *chunks_; }
  bool on_reactor_thread() const { return reactor_->on_reactor_thread(); }
  void quiesce() { reactor_->quiesce(); }

  // A marker for everything enqueued on `s` (of `device`) so far. A marker
  // that could not be recorded is returned completed, with the error. Its
  // callbacks run on options().completions, holding the context.
  marker_ptr record(int device, cuda::stream_t s,
                    cuda::api::site where = cuda::api::site::current());

  // Makes `s` wait on the device for `m`, a marker of this context still
  // pending. Returns false when `m` is not one (or no longer pending);
  // `status` receives the error of the wait.
  bool wait_for(int device, cuda::stream_t s, const completion_marker* m, absl::Status& status,
                cuda::api::site where = cuda::api::site::current());

  // Makes `waiter` (a stream of `waiter_device`) hold until `signaller` (of
  // `signaller_device`) reaches this point; no host wait. The event is one
  // of the signaller's device: CUDA refuses to record an event on a stream
  // of another device.
  absl::Status order_after(int waiter_device, cuda::stream_t waiter, int signaller_device,
                           cuda::stream_t signaller,
                           cuda::api::site where = cuda::api::site::current());

  // Calls `done` once everything enqueued so far on `streams` has run, or
  // never will run (a failed context). Error paths call it before they
  // release memory, staging chunks or the source: work enqueued before the
  // error may still read or write them. A marker that cannot be recorded is
  // retried; when recording keeps failing the context is taken for failed.
  void drain(const std::vector<device_stream>& streams, std::function<void()> done);

  // Frees stream-ordered device memory on `s`. Memory whose free fails (a
  // failed call or context) is freed again at teardown instead of lost.
  absl::Status release_memory(int device, void* p, cuda::stream_t s,
                              cuda::api::site where = cuda::api::site::current());

  // A marker that completes when the producer's stream `producer_stream`
  // (DLPack encoding) reaches the point of this call; completed at once for
  // stream_no_sync. The special handles (1, 2) name streams of GPU `gpu` as
  // the calling thread sees them: 2 is this thread's own, so the call must
  // be made on the thread that calls the import. A stream handle is asked
  // for its own device.
  marker_ptr record_producer(int gpu, std::int64_t producer_stream);

  // Makes the caller's stream `consumer_stream` (DLPack encoding) of GPU
  // `d` wait on the device for `m`. Unimplemented when `m` is no pending
  // marker of this context (a transfer that finishes on the host): the
  // caller then waits on the host instead.
  absl::Status order_consumer(device d, std::int64_t consumer_stream, const marker_ptr& m);

  // The device that owns `pointer`: a GPU, its managed memory, or pinned
  // host memory (cuda_host:0); empty for memory CUDA does not know
  // (pageable host memory). The failure of the query itself as its status.
  absl::StatusOr<std::optional<device>> device_of(const void* pointer);

 private:
  struct live_event {
    int device;
    cuda::event_t event;
  };

  cuda_context(std::shared_ptr<cuda::api> api, cuda_options options);

  std::shared_ptr<cuda::api> api_;
  const cuda_options options_;
  std::optional<stream_pool> streams_;
  std::unique_ptr<event_pool> events_;
  std::unique_ptr<chunk_pool> chunks_;
  std::unique_ptr<reactor> reactor_;

  std::mutex live_mutex_;
  std::unordered_map<const completion_marker*, live_event> live_;

  std::mutex unfreed_mutex_;
  std::vector<std::pair<int, void*>> unfreed_memory_;
};

}  // namespace dlasync::detail
