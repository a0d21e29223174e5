// `dlasync::cuda::sim_api` (internal) is a simulated CUDA runtime for
// machines without a GPU, as strict as the hardware about the rules dlasync
// must follow, and with a race checker for stream order:
//   - each stream is an in-order queue run by its own thread; events
//     complete when the stream reaches them; stream waits hold a stream
//     until an event completes, across streams and devices;
//   - the legacy default stream (handles 0 and 1) of each device waits for
//     the blocking streams of its device and they wait for it; handle 2 is
//     a stream of the calling thread and its current device;
//   - device memory is host memory tagged with its device, counted against
//     a per-device capacity (cudaErrorMemoryAllocation beyond it); freed
//     device memory stays in a quarantine for a while, so that a late use
//     is reported instead of reading reused memory;
//   - copies to or from pageable memory hold the caller until they ran, as
//     the driver does; copies between page-locked and device memory do not;
//   - each device has copy engines (one per direction when there are two or
//     more) that copies occupy for bytes / bandwidth, and copies and kernels
//     take at least `min_op_us`, so that races stay open long enough;
//   - CUDA's rules are enforced with cudart's error codes: an event recorded
//     on another device's stream, a kernel launched on a stream of a device
//     that is not current, a memcpy kind that disagrees with the pointers,
//     pool memory reached from another device without pool access, a
//     destroyed or unknown handle, a double or wild free, a misaligned load
//     or store in a kernel (sticky). Each failing call sets the calling
//     thread's last error;
//   - failures can be injected: the n-th call of a function, the k-th call
//     of any function, or a sticky error that every later call and stream
//     operation reports, like a corrupted context. The device stops then:
//     copies and kernels running at that moment finish before the failing
//     call returns, queued ones never run.
// Broken rules and races (sim_checker.hpp) are reports: see `on_report`.
//
// Select it with the runtime option or environment DLASYNC_CUDA=sim:N. Its
// devices are named "dlasync simulated GPU N". Kernels run on the stream's
// thread as their `simulate()`, taking the time their output needs at the
// device-to-device rate.
//
// Its files, by concern: sim_api.cpp (devices, contexts, the last error,
// reports), sim_streams.cpp (streams, events, host functions, kernels),
// sim_memory.cpp (memory, pointer attributes, copies and the copy
// engines), sim_faults.cpp (fault injection and the failed context),
// sim_checker.cpp (the race checker). Tests reach the fault injection, the
// reports and the statistics; the runtime sees only the `cuda::api` seam.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/sim/sim_checker.hpp"
#include "runtime/src/cuda/cuda_api.hpp"

namespace dlasync::cuda {

// What a simulation does with a report.
enum class report_action {
  collect,  // keep it (sim_api::take_reports, take_sim_reports)
  abort,    // print it and abort the process
};

// The defaults of the two settings below, from DLASYNC_SIM_CHECK: "off"
// (no race checker; rules still enforced), "abort", or anything else
// (checker on, reports collected).
bool default_check_order();
report_action default_report_action();

struct sim_options {
  int devices = 2;
  std::uint64_t memory_per_device = std::uint64_t{1} << 30;
  int copy_engines = 2;
  double host_to_device_gbps = 25.0;
  double device_to_host_gbps = 25.0;
  double device_to_device_gbps = 400.0;
  // Copies shorter than this take no simulated time (sleeping is coarse).
  double min_sleep_us = 20.0;
  // Every copy and kernel takes at least this long, so that work that the
  // host or another stream wrongly takes for finished is still running.
  double min_op_us = 0.0;
  // Freed device memory kept for reuse by size, up to this many bytes per
  // device, so that the host pages standing in for it stay resident as
  // device memory is: benchmarks set it, to keep host page faults out of
  // simulated copy times. 0 (the default) quarantines freed memory instead.
  std::uint64_t device_reuse_bytes = 0;
  // Freed device memory held back before it goes back to the host heap
  // (oldest first), so that any use of it is reported as a use after free.
  std::uint64_t quarantine_bytes = std::uint64_t{64} << 20;
  // The race checker (rules are always enforced).
  bool check_order = default_check_order();
  report_action on_report = default_report_action();
  // Also print each report to stderr as it is made (the "sim:N" mode does:
  // nobody claims its reports).
  bool print_reports = false;
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
  // The devices whose context this simulation has opened, in order.
  std::vector<int> contexts() const;
  // This simulation's reports not yet taken (also from the process-wide
  // list), oldest first.
  std::vector<std::string> take_reports();
  // Reports this simulation has made, taken or not.
  std::uint64_t report_count() const noexcept { return report_count_.load(); }
  // Access records the race checker holds.
  std::size_t checker_records() const { return checker_.records(); }

  error get_device_count(int* count) override;
  error get_current_context(context_t* context) override;
  error set_current_context(context_t context) override;
  error set_device(int device) override;
  error get_device(int* device) override;
  error get_device_properties(device_properties* properties, int device) override;
  error device_can_access_peer(int* can, int device, int peer) override;
  error device_enable_peer_access(int peer) override;
  error stream_create(stream_t* stream, stream_flags flags = stream_flags::non_blocking) override;
  error stream_get_device(stream_t stream, int* device) override;
  error stream_destroy(stream_t stream) override;
  error event_create(event_t* event) override;
  error event_destroy(event_t event) override;
  error event_record(event_t event, stream_t stream, site where = site::current()) override;
  error event_query(event_t event) override;
  error stream_wait_event(stream_t stream, event_t event, site where = site::current()) override;
  error malloc_device(void** pointer, std::size_t bytes) override;
  error malloc_async(void** pointer, std::size_t bytes, stream_t stream,
                     site where = site::current()) override;
  error mem_pool_set_access(int device, int peer) override;
  error free_async(void* pointer, stream_t stream, site where = site::current()) override;
  error malloc_host(void** pointer, std::size_t bytes) override;
  error free_host(void* pointer) override;
  error malloc_managed(void** pointer, std::size_t bytes) override;
  error free_device(void* pointer) override;
  error memcpy_async(void* dst, const void* src, std::size_t bytes, memcpy_kind kind,
                     stream_t stream, site where = site::current()) override;
  error pointer_get_attributes(pointer_attributes* attributes, const void* pointer) override;
  error launch_host_func(stream_t stream, std::function<void()> fn,
                         site where = site::current()) override;
  error launch_kernel(std::shared_ptr<const device_kernel> kernel, stream_t stream,
                      site where = site::current()) override;
  error get_last_error() override;
  error peek_at_last_error() override;
  void host_access(const void* pointer, std::uint64_t bytes, host_use use, const char* what,
                   std::uint64_t owner = 0, site where = site::current()) override;

 private:
  struct stream;
  struct event;
  struct engine;
  enum class state : std::uint8_t { live, free_pending, quarantined };
  struct allocation {
    std::size_t bytes = 0;
    int device = 0;
    memory_type type = memory_type::unregistered;
    bool pool = false;  // from cudaMallocAsync: peers need pool access
    state status = state::live;
  };
  // A pointer's allocation as a call saw it.
  struct located {
    pointer_attributes attributes;  // unregistered for freed memory
    bool known = false;             // CUDA memory, live or freed
    allocation info;
    std::uintptr_t base = 0;
  };

  error enter(const char* call);
  // Sets the calling thread's last error to `e` and returns it.
  static error failed(error e);
  // A broken rule: reports `message` and fails the call with `e`.
  error refuse(error e, const char* call, const std::string& message, site where);
  // refuse() for a `kind` ("stream", "event") handle that names nothing
  // live: cudaErrorInvalidResourceHandle.
  error unknown_handle(const char* call, const char* kind, site where);
  void report(std::string text);
  void open_context(int device);
  // Under mutex_: the context fails with `e`.
  void fail_context_locked(error e);
  // Wakes the streams waiting for events, to see a failed context.
  void wake_event_waiters();
  // After the context failed: wakes the waiting streams and returns once
  // the copies and kernels running at that moment have finished.
  void context_failed();
  // Context failures so far; work enqueued at `epoch` runs only while
  // failed_since(epoch) is false.
  std::uint64_t epoch() const;
  bool failed_since(std::uint64_t epoch) const;
  // The stream behind `handle` for the calling thread (0 and 1: the current
  // device's legacy stream; 2: the thread's own on the current device);
  // nullptr for a handle that names no live stream.
  std::shared_ptr<stream> find_stream(stream_t handle);
  std::shared_ptr<stream> new_stream(int device, bool blocking, const char* kind);
  std::shared_ptr<event> find_event(event_t handle);
  located locate(const void* pointer) const;
  // Memory of `type` on `device`, counted against its capacity.
  error allocate(void** pointer, std::size_t bytes, memory_type type, int device, bool pool);
  // Frees device or managed memory, or keeps it for reuse or quarantine;
  // under mutex_.
  void release_locked(std::map<std::uintptr_t, allocation>::iterator it);
  // Checks that `kernel` or copy operands on another device than `device`
  // are reachable from it; a report and the error otherwise.
  error check_reach(const located& where, int device, const char* call, const char* role, site at);
  void start_worker(stream& s);
  // Puts `op` on `s` in stream order (after the legacy stream's implicit
  // synchronization), records its accesses with the race checker, and runs
  // it unless the context has failed since (or whatever happened, with
  // `always`).
  void enqueue(const std::shared_ptr<stream>& s, std::function<void()> op,
               std::span<const access> accesses, const op_label& label, bool always = false);
  // Under order_mutex_: the implicit synchronization of the legacy stream.
  void order_with_legacy(const std::shared_ptr<stream>& s);
  void push(stream& s, std::function<void()> op);
  // `waiter` holds until `signaller` has run what it holds now.
  void chain(const std::shared_ptr<stream>& waiter, const std::shared_ptr<stream>& signaller);
  // The host waits until `s` has run what it holds now (or the context
  // failed).
  void drain_stream(const std::shared_ptr<stream>& s);
  // A device-wide synchronization (cudaFree, cudaFreeHost): the host
  // waits for every stream of every device.
  void synchronize_all();
  void run_copy(int device, int direction, std::size_t bytes, double gbps);
  void stream_busy(int delta);

  const sim_options options_;
  const std::uint64_t id_;
  std::atomic<std::uint64_t> calls_{0};
  std::atomic<std::uint64_t> report_count_{0};
  order_checker checker_;

  mutable std::mutex mutex_;
  // Held while work is stamped and queued, so that the race checker sees
  // each stream's work in the order the stream runs it.
  std::mutex order_mutex_;
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
  std::vector<std::shared_ptr<stream>> legacy_streams_;  // per device
  // Per-thread default streams, by thread and device.
  std::map<std::pair<std::thread::id, int>, std::shared_ptr<stream>> thread_streams_;
  std::map<std::uintptr_t, allocation> memory_;
  std::deque<std::pair<std::uintptr_t, std::size_t>> quarantine_;
  std::uint64_t quarantined_bytes_ = 0;
  std::vector<std::uint64_t> device_used_;
  // Freed device blocks kept for reuse (device_reuse_bytes): per device,
  // by rounded size.
  std::vector<std::multimap<std::size_t, void*>> reusable_;
  std::vector<std::uint64_t> reusable_bytes_;
  std::uint64_t pinned_ = 0;
  std::vector<std::vector<bool>> peer_enabled_;  // [device][peer]
  std::vector<std::vector<bool>> pool_access_;   // [pool's device][peer]
  std::vector<int> contexts_;
  int stream_count_ = 0;
  sim_stats stats_;
  int busy_streams_ = 0;
  int active_copies_ = 0;
  std::vector<std::unique_ptr<engine>> engines_;  // [device * 2 + direction]
};

}  // namespace dlasync::cuda
