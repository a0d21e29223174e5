// `directory_waits` (internal): every wait of one directory (wait_for,
// wait_withdrawn, import_remote_named) on one thread and one subscription,
// rather than a thread and a connection each. A wait is a look (a command
// on the directory's store that says whether the wait is over) and an end
// (told once). The loop looks at a wait's name when the wait arrives; when
// that finds nothing, it subscribes to the name's channel (one
// subscription a name, shared by its waits) and looks again once the
// server confirms it, then whenever a message comes on the channel, every
// recheck, at the time the look asked for (a ttl's end), and at the wait's
// deadline. Without a subscription (none could be made yet, or the server
// refuses pub/sub) it polls each wait, every 1 ms at first and 50 ms at
// most, and makes the subscription again no sooner than 100 ms (or a
// recheck, when shorter) after the last try (never where refused). Looks
// run one at a time on the loop's thread, each bounded by the store's
// io_timeout (several, when the server is slow, so a wait may end that
// much past its deadline); a cancellation or the stop is taken after the
// look under way. Ends run on the loop too, so they must only hand their
// result on.
//
// Thread safety: all members are safe to call from any thread, but the
// destructor, which ends the waits still under way (Cancelled) and joins
// the loop.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "dlasync/remote_directory.hpp"

namespace dlasync::remote_detail {

class directory_waits {
 public:
  using clock = std::chrono::steady_clock;
  // Looks once: true when the wait is over (what it found is the end's to
  // keep). It may set `due` to a time to look again that the name's
  // channel will not tell (a ttl's end).
  using look_fn = absl::AnyInvocable<bool(clock::time_point& due)>;
  // Why a wait ended: its look said so (OK), its deadline passed
  // (DeadlineExceeded), it was cancelled or the directory is being
  // destroyed (Cancelled), or it was never admitted (ResourceExhausted:
  // `most` wait already). Called once.
  using end_fn = absl::AnyInvocable<void(absl::Status why) &&>;

  directory_waits(remote_directory_options options, std::size_t most);
  directory_waits(const directory_waits&) = delete;
  directory_waits& operator=(const directory_waits&) = delete;
  ~directory_waits();

  // Adds a wait on `key` (a name's key, which is its channel too) until
  // `until`: its id, for cancel. Refused at once (end called here) with
  // ResourceExhausted where `most` wait already, or Cancelled after
  // the destructor began; 0 then.
  std::uint64_t add(std::string key, clock::time_point until, look_fn look, end_fn end);
  // Ends the wait `id` with Cancelled, if it has not ended; any thread.
  void cancel(std::uint64_t id);
  // Ends every wait still under way with Cancelled, refuses later ones,
  // and joins the loop. Not from an end.
  void stop();

 private:
  struct wait;
  struct channel;
  void run();
  // Wakes the loop (guarded by mutex_, as wake_fd_ is set under it).
  void wake_locked();

  const remote_directory_options options_;
  const std::size_t most_;
  std::mutex mutex_;
  // Guarded by mutex_: handed to the loop at its next turn.
  std::vector<std::unique_ptr<wait>> incoming_;
  std::vector<std::uint64_t> cancelled_;
  std::size_t waiting_ = 0;  // added and not ended
  std::uint64_t last_id_ = 0;
  bool stopping_ = false;
  // A cancellation or the stop to take before the next look (set under
  // mutex_, read by the loop between looks).
  std::atomic<bool> attention_{false};
  int wake_fd_ = -1;    // an eventfd: the loop polls it beside the subscription
  std::thread thread_;  // started with the first wait
};

}  // namespace dlasync::remote_detail
