// `directory_watch` (internal): a subscription to one name's channel in the
// directory's Redis server, on a connection of its own (a subscribed
// connection takes no other commands). Writers publish on the channel of a
// name's key when they put or withdraw it (directory.cpp), so a wait wakes
// when the name changes rather than at its next poll. What arrives is only
// a cue to look again: its contents are never read as an entry.
//
// Thread safety: none; one waiting thread owns it.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "dlasync/remote_directory.hpp"

namespace dlasync::remote_detail {

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

  // Waits at most `wait` for a message on the channel: true when one (or
  // more) came, false when the wait passed, or the connection broke (the
  // caller looks again either way; a broken watch stays broken and returns
  // at once after that wait).
  bool changed(std::chrono::milliseconds wait);

 private:
  explicit directory_watch(redisContext* c) noexcept : context_(c) {}
  redisContext* context_;
  bool broken_ = false;
};

}  // namespace dlasync::remote_detail
