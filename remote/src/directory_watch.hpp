// `directory_watch` (internal): one connection to the directory's Redis
// server, subscribed to the channels of the names its waits look for (a
// subscribed connection takes no other commands). Writers publish on the
// channel of a name's key when they put or withdraw it (directory.cpp), so
// a wait wakes when its name changes rather than at its next look. What
// arrives is only a cue to look again: a message's contents are never read
// as an entry. A hostile server's words can cost looks, and the memory
// of at most max_message_bytes a message (arrays bounded by
// connect_redis's reply functions).
//
// Thread safety: none; the directory's wait loop (directory_waits.hpp) owns
// it.
#pragma once

#include <hiredis/hiredis.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dlasync/remote_directory.hpp"

namespace dlasync::remote_detail {

class directory_watch {
 public:
  // The longest message heard: a subscription's confirmation or a cue
  // names a channel (a key: the prefix and a name of at most 512 bytes),
  // and a writer's message is a word. A longer one breaks the connection.
  static constexpr std::size_t max_message_bytes = std::size_t{64} << 10;

  // Connects, bounded by options.io_timeout: Unavailable when the server
  // cannot be reached.
  static absl::StatusOr<std::unique_ptr<directory_watch>> open(
      const remote_directory_options& options);

  directory_watch(const directory_watch&) = delete;
  directory_watch& operator=(const directory_watch&) = delete;
  ~directory_watch();

  // The connection's descriptor, to poll for reading.
  int fd() const noexcept { return context_->fd; }

  // Asks to (un)subscribe to `channel`: written now, each write bounded by
  // io_timeout; the confirmation comes through read(). A connection that
  // cannot take it is broken.
  void subscribe(const std::string& channel);
  void unsubscribe(const std::string& channel);

  // What read() found.
  struct heard {
    // The channels of subscriptions confirmed, and of messages, in order:
    // each a cue to look at its name.
    std::vector<std::string> cues;
    // The server refused a subscription (NOPERM, or an unknown command:
    // pub/sub not allowed here); any other error reply breaks the
    // connection instead.
    bool refused = false;
  };
  // Reads what has arrived (call it when fd() is readable). A connection
  // that closed, failed, or sent bytes that are no reply is broken.
  heard read();

  // Nothing more comes on the connection: the caller opens another.
  bool broken() const noexcept { return broken_; }

 private:
  explicit directory_watch(redisContext* c) noexcept : context_(c) {}
  void send(const char* command, const std::string& channel);
  redisContext* context_;
  bool broken_ = false;
  // Bytes read since the last whole reply.
  std::size_t unfinished_ = 0;
};

}  // namespace dlasync::remote_detail
