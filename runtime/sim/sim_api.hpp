// `dlasync::cuda::sim_api` (internal) is a simulated CUDA runtime for
// machines without a GPU, faithful enough that ordering bugs show up in it:
//   - each stream is an in-order queue run by its own thread;
//   - events complete when the stream reaches them; stream waits hold a
//     stream until an event completes, across streams and devices;
//   - device memory is host memory tagged with its device, counted against
//     a per-device capacity (cudaErrorMemoryAllocation beyond it);
//   - copies to or from pageable memory hold the caller until they ran, as
//     the driver does; copies between page-locked and device memory do not;
//   - each device has copy engines (one per direction when there are two or
//     more) that copies occupy for bytes / bandwidth;
//   - failures can be injected: the n-th call of a function, the k-th call
//     of any function, or a sticky error that every later call and stream
//     operation reports, like a corrupted context. The device stops then:
//     copies and kernels running at that moment finish before the failing
//     call returns, queued ones never run.
// Select it with the runtime option or environment DLASYNC_CUDA=sim:N. Its
// devices are named "dlasync simulated GPU N". Kernels run on the stream's
// thread as their `simulate()`, taking the time their output needs at the
// device-to-device rate.
//
// Its files, by concern: sim_api.cpp (devices and their properties),
// sim_streams.cpp (streams, events, host functions, kernels),
// sim_memory.cpp (memory, pointer attributes, copies and the copy
// engines), sim_faults.cpp (fault injection and the failed context).
// Tests reach the fault injection and the statistics; the runtime sees only
// the `cuda::api` seam.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/src/cuda/cuda_api.hpp"

namespace dlasync::cuda {

struct sim_options {
  int devices = 2;
  std::uint64_t memory_per_device = std::uint64_t{1} << 30;
  int copy_engines = 2;
  double host_to_device_gbps = 25.0;
  double device_to_host_gbps = 25.0;
  double device_to_device_gbps = 400.0;
  // Copies shorter than this take no simulated time (sleeping is coarse).
  double min_sleep_us = 20.0;
  // Freed device memory kept for reuse by size, up to this many bytes per
  // device, so that the host pages standing in for it stay resident as
  // device memory is: benchmarks set it, to keep host page faults out of
  // simulated copy times. 0 (the default) frees at once, so that a
  // sanitizer sees a read after free.
  std::uint64_t device_reuse_bytes = 0;
};

struct sim_stats {
  std::uint64_t pageable_copies = 0;
  std::uint64_t async_copies = 0;
  std::uint64_t bytes_copied = 0;
  int peak_busy_streams = 0;   // streams executing work at the same moment
  int peak_active_copies = 0;  // copies in flight on engines at the same moment
};

class sim_api final : public api {
 public:
  explicit sim_api(sim_options options = {});
  ~sim_api() override;

  bool simulated() const noexcept override { return true; }
  const sim_options& options() const noexcept { return options_; }

  // Fault injection. `call` is the cudart name ("cudaMemcpyAsync"); `nth`
  // counts from 1 = the next such call.
  // With `sticky`, that call also corrupts the context (see below).
  void fail_call(const std::string& call, int nth, error e, bool sticky = false);
  // The k-th next call of any function (1 = the next) fails with `e`; with
  // `sticky`, that call also corrupts the context: from then on everything
  // fails with `e`, as after a kernel fault.
  void fail_nth_call(std::uint64_t k, error e, bool sticky = false);
  // From now on every call and every stream operation fails with `e`.
  void make_sticky(error e);
  // Disarms planned failures and lets calls succeed again; work that was
  // queued when the context failed stays discarded.
  void clear_faults();
  // The error of a failed (sticky) context, or success.
  error sticky_error() const;
  std::uint64_t calls() const noexcept { return calls_.load(); }
  // Calls so far, per cudart function name.
  std::map<std::string, std::uint64_t> call_counts() const;
  sim_stats stats() const;
  // Device bytes allocated and not yet freed.
  std::uint64_t device_bytes_in_use(int device) const;
  std::uint64_t host_bytes_pinned() const;

  error get_device_count(int* count) override;
  error set_device(int device) override;
  error get_device(int* device) override;
  error get_device_properties(device_properties* properties, int device) override;
  error device_can_access_peer(int* can, int device, int peer) override;
  error device_enable_peer_access(int peer) override;
  error stream_create(stream_t* stream) override;
  error stream_destroy(stream_t stream) override;
  error event_create(event_t* event) override;
  error event_destroy(event_t event) override;
  error event_record(event_t event, stream_t stream) override;
  error event_query(event_t event) override;
  error stream_wait_event(stream_t stream, event_t event) override;
  error malloc_device(void** pointer, std::size_t bytes) override;
  error malloc_async(void** pointer, std::size_t bytes, stream_t stream) override;
  error free_async(void* pointer, stream_t stream) override;
  error malloc_host(void** pointer, std::size_t bytes) override;
  error free_host(void* pointer) override;
  error malloc_managed(void** pointer, std::size_t bytes) override;
  error free_device(void* pointer) override;
  error memcpy_async(void* dst, const void* src, std::size_t bytes, memcpy_kind kind,
                     stream_t stream) override;
  error pointer_get_attributes(pointer_attributes* attributes, const void* pointer) override;
  error launch_host_func(stream_t stream, std::function<void()> fn) override;
  error launch_kernel(std::shared_ptr<const device_kernel> kernel, stream_t stream) override;

 private:
  struct stream;
  struct event;
  struct engine;
  struct allocation {
    std::size_t bytes;
    int device;
    memory_type type;
  };

  error enter(const char* call);
  // Wakes the streams waiting for events, to see a failed context.
  void wake_event_waiters();
  // After the context failed: wakes the waiting streams and returns once
  // the copies and kernels running at that moment have finished.
  void context_failed();
  // Context failures so far; work enqueued at `epoch` runs only while
  // failed_since(epoch) is false.
  std::uint64_t epoch() const;
  bool failed_since(std::uint64_t epoch) const;
  std::shared_ptr<stream> find_stream(stream_t handle);
  std::shared_ptr<event> find_event(event_t handle);
  pointer_attributes locate(const void* pointer) const;
  // Memory of `type` on the current device, counted against its capacity.
  error allocate(void** pointer, std::size_t bytes, memory_type type);
  // Frees device or managed memory, or keeps it for reuse; under mutex_.
  void release_locked(std::map<std::uintptr_t, allocation>::iterator it);
  void start_worker(stream& s);
  // Runs `op` in stream order unless the context has failed since.
  void enqueue(const std::shared_ptr<stream>& s, std::function<void()> op);
  // Runs `op` in stream order whatever happened.
  void enqueue_always(const std::shared_ptr<stream>& s, std::function<void()> op);
  void run_copy(int device, int direction, std::size_t bytes, double gbps);
  void stream_busy(int delta);

  const sim_options options_;
  std::atomic<std::uint64_t> calls_{0};

  mutable std::mutex mutex_;
  // Held shared by running copies and kernels; a failing context takes it
  // alone, so that nothing touches memory once a failure is reported.
  std::shared_mutex running_;
  error sticky_ = error::success;
  std::uint64_t failures_ = 0;
  // A planned failure: the call number (overall, or of one function).
  struct nth_fault {
    std::uint64_t call;
    error e;
    bool sticky;
  };
  std::map<std::string, std::vector<nth_fault>> call_faults_;
  std::vector<nth_fault> nth_faults_;
  std::map<std::string, std::uint64_t> call_counts_;
  std::unordered_map<void*, std::shared_ptr<stream>> streams_;
  std::unordered_map<void*, std::shared_ptr<event>> events_;
  std::vector<std::shared_ptr<stream>> default_streams_;  // per device
  std::map<std::uintptr_t, allocation> memory_;
  std::vector<std::uint64_t> device_used_;
  // Freed device blocks kept for reuse (device_reuse_bytes): per device,
  // by rounded size.
  std::vector<std::multimap<std::size_t, void*>> reusable_;
  std::vector<std::uint64_t> reusable_bytes_;
  std::uint64_t pinned_ = 0;
  std::vector<std::vector<bool>> peer_enabled_;
  sim_stats stats_;
  int busy_streams_ = 0;
  int active_copies_ = 0;
  std::vector<std::unique_ptr<engine>> engines_;  // [device * 2 + direction]
};

}  // namespace dlasync::cuda
