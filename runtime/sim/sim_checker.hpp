// `dlasync::cuda::order_checker` (internal to runtime/sim/) is the simulated
// runtime's stream-order race checker: a happens-before model of CUDA
// streams, events and the host, in which a missing event wait or host
// synchronization is reported on every run, whatever the timing.
//
// Clocks. Each stream has a vector clock, with one slot per stream. An
// operation enqueued on a stream ticks that stream's slot and first takes in
// what the host knows (the host enqueues it after everything it has seen
// complete). An event record captures the stream's clock; a stream wait
// merges the captured clock into the waiting stream's; the host learns a
// clock when it sees an event complete (a query that says done), when a
// pageable copy returns, or when a call synchronizes the device. All of this
// happens when the host makes the call, in call order, so that the model
// does not depend on when the simulated streams actually run. The host has
// one clock for all its threads: host threads order themselves (with
// mutexes, posts, markers), which ThreadSanitizer checks, not this.
//
// Accesses. Each operation declares the byte ranges it reads and writes, the
// stream-ordered allocation it makes and the free it orders. An access is
// recorded with its stream and tick. Two accesses conflict when their bytes
// overlap and one of them writes, allocates or frees; a conflict is reported
// when neither is ordered before the other. (A use after a free, ordered
// or not, the simulation refuses itself: it knows the memory gone.) The
// host's uses (a DLPack deleter, a staging chunk refilled, read
// or given back, memory freed) are checked against the device accesses the
// host does not yet know complete.
//
// Records the host knows complete can never conflict again and are dropped,
// as are those a free or a host release covers.
//
// Thread safety: all members are safe from any thread (one mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/src/cuda/cuda_api.hpp"

namespace dlasync::cuda {

enum class access_kind : std::uint8_t { read, write, allocate, free };

// One byte range an operation touches, within the allocation that starts at
// `allocation` (records are kept per allocation: only accesses to one
// allocation can overlap).
struct access {
  std::uintptr_t begin = 0;
  std::uint64_t bytes = 0;
  access_kind kind = access_kind::read;
  std::uintptr_t allocation = 0;
};

// An operation as reports name it.
struct op_label {
  std::string call;         // "cudaMemcpyAsync (host to device, 4096 bytes)"
  std::string where;        // the library's call site, "file.cpp:52"
  std::uint64_t owner = 0;  // the copy it was enqueued for (cuda::work_owner)
};

class order_checker {
 public:
  using clock = std::vector<std::uint64_t>;

  // A new stream's clock slot; `name` ("stream #4 of cuda:1, non-blocking")
  // is how reports name it.
  std::uint32_t add_stream(std::string name);

  // An operation enqueued on `stream`: takes in the host's clock, ticks the
  // stream, and checks and records `accesses`. Returns the reports found.
  std::vector<std::string> enqueue(std::uint32_t stream, std::span<const access> accesses,
                                   const op_label& label);

  // The stream's clock as an event recorded now captures it.
  clock capture(std::uint32_t stream);
  // `stream` waits for `captured` (cudaStreamWaitEvent).
  void wait(std::uint32_t stream, const clock& captured);
  // `stream` waits for everything enqueued so far on `other` (the legacy
  // default stream's implicit synchronization).
  void wait_for_stream(std::uint32_t stream, std::uint32_t other);
  // The host has seen the work `captured` covers complete.
  void host_learns(const clock& captured);
  // The host knows everything enqueued so far on every stream complete, or
  // never to run (a synchronizing call, a failed context).
  void host_learns_everything();

  // The host is about to `use` [begin, begin + bytes): checked against the
  // work of copy `label.owner` only, when that is not 0. Returns the
  // reports.
  std::vector<std::string> host_access(std::uintptr_t allocation, std::uintptr_t begin,
                                       std::uint64_t bytes, host_use use, const op_label& label);

  // The allocation at `allocation` was made or left the quarantine: its
  // history ends.
  void forget(std::uintptr_t allocation);

  // Accesses on record, for tests of the pruning.
  std::size_t records() const;

 private:
  struct record {
    std::uintptr_t begin;
    std::uintptr_t end;
    access_kind kind;
    std::uint32_t stream;
    std::uint64_t tick;
    std::shared_ptr<const op_label> label;
  };

  bool host_knows(const record& r) const {
    return r.stream < host_.size() && host_[r.stream] >= r.tick;
  }
  static void join(clock& into, const clock& from);
  std::string describe(const record& r) const;
  // Drops the records the host knows complete (not tombstones).
  void prune();

  mutable std::mutex mutex_;
  std::vector<std::string> names_;
  std::vector<clock> streams_;
  clock host_;
  std::unordered_map<std::uintptr_t, std::vector<record>> records_;  // by allocation
  std::size_t count_ = 0;
  std::size_t prune_at_ = 256;
};

// Reports are the simulation's findings: rule violations (a call real CUDA
// refuses) and races. What happens with them is set per simulation
// (sim_options::on_report) and, by default, by DLASYNC_SIM_CHECK: "abort"
// stops the process at the first report, "off" turns the race checker off,
// anything else collects them. Collected reports are also kept process-wide
// until `take_sim_reports` claims them, so that a test harness can fail the
// test that caused them.
std::vector<std::string> take_sim_reports();
// Reports made so far in this process, claimed or not.
std::uint64_t sim_report_count();
// Adds `report` to the process-wide list (the simulation does).
void add_sim_report(std::string report);

}  // namespace dlasync::cuda
