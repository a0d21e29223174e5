// `directory_watch` (internal): a subscription to one name's channel in the
// directory's Redis server, on a connection of its own (a subscribed
// connection takes no other commands). Writers publish on the channel of a
// name's key when they put or withdraw it (directory.cpp), so a wait wakes
// when the name changes rather than at its next poll. What arrives is only
// a cue to look again: its contents are never read as an entry. The
// directory's own connection is made the same way (connect_redis).
//
// Thread safety: none; one waiting thread owns it.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "dlasync/remote_directory.hpp"

namespace dlasync::remote_detail {

// Unavailable, naming the directory's server and `what` failed.
absl::Status unreachable(const remote_directory_options& options, std::string_view what);

// A blocking connection to the directory's server, connecting and every
// command bounded by options.io_timeout; unreachable's status when it cannot
// be made. The caller frees it (redisFree).
absl::StatusOr<redisContext*> connect_redis(const remote_directory_options& options);

class directory_watch {
 public:
  // Subscribes to `channel`, each step bounded by options.io_timeout.
  // Unavailable when the server cannot be reached;
  // FailedPrecondition when it refuses the subscription (a server that
  // allows no pub/sub): the caller then polls.
  static absl::StatusOr<std::unique_ptr<directory_watch>> open(
      const remote_directory_options& options, const std::string& channel);

  directory_watch(const directory_watch&) = delete;
  directory_watch& operator=(const directory_watch&) = delete;
  ~directory_watch();

  // Returns when a message came on the channel, `wait` has passed, or the
  // connection broke: the caller looks again in every case. A broken watch
  // returns at once.
  void changed(std::chrono::milliseconds wait);
  // The connection broke (closed, failed, or sent bytes that are no
  // reply): nothing more comes on it, and the caller subscribes again.
  bool broken() const noexcept { return broken_; }

 private:
  explicit directory_watch(redisContext* c) noexcept : context_(c) {}
  // Frees the replies read already (several may come in one read): true
  // when there were any, or when the bytes are no reply (broken then).
  bool drain();
  redisContext* context_;
  bool broken_ = false;
};

}  // namespace dlasync::remote_detail
