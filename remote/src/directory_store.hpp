// `redis_store` (internal): a directory's one connection to its Redis
// server for commands (its waits' subscription has another,
// directory_watch.hpp): hiredis's context, parser and reply objects, its
// bytes written and read here. One command at a time under its lock, each
// (written and answered) within io_timeout; a connection that broke is
// made afresh by the next command. Scripts go by their digest (EVALSHA), loaded
// once (SCRIPT LOAD) and again when the server has lost them (NOSCRIPT:
// restarted, or SCRIPT FLUSH); a server that will not load them (an ACL
// that refuses SCRIPT LOAD) is sent each script whole (EVAL), as before.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <hiredis/hiredis.h>

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "dlasync/remote_directory.hpp"

namespace dlasync::remote_detail {

// Unavailable, naming the directory's server and `what` failed.
absl::Status unreachable(const remote_directory_options& options, std::string_view what);

// A blocking connection to the directory's server, connecting and every
// command bounded by options.io_timeout; unreachable's status when it cannot
// be made. The caller frees it (redisFree).
absl::StatusOr<redisContext*> connect_redis(const remote_directory_options& options);

struct reply_deleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

// A Lua script the directory runs on the server, and its place among the
// store's digests (below script_slots).
struct lua_script {
  std::string_view text;
  std::size_t slot;
};

// The most bytes read for one reply: a whole entry (GETRANGE's, at most
// max_entry_bytes and one more) and room for its framing. A server that
// sends more is cut off (DataLoss) rather than buffered.
inline constexpr std::size_t max_reply_bytes = remote_directory::max_entry_bytes + (64 << 10);

class redis_store {
 public:
  static constexpr std::size_t script_slots = 4;

  explicit redis_store(remote_directory_options options) : options_(std::move(options)) {}
  redis_store(const redis_store&) = delete;
  redis_store& operator=(const redis_store&) = delete;
  ~redis_store();

  // Connects now, when not connected: Unavailable (unreachable's) when the
  // server cannot be reached.
  absl::Status connect();

  // Runs one command (its arguments binary-safe): the reply, or Unavailable
  // when the server cannot be reached or the connection broke, DataLoss
  // when it sends more than max_reply_bytes for the reply, or bytes that
  // are no reply (the connection is dropped then).
  absl::StatusOr<reply_ptr> command(const std::vector<std::string_view>& args);

  // Runs `script` with `keys_and_args` (the key count first, as EVAL takes
  // them): its reply, as command's.
  absl::StatusOr<reply_ptr> run(const lua_script& script,
                                const std::vector<std::string_view>& keys_and_args);

 private:
  absl::Status connect_locked();
  absl::StatusOr<reply_ptr> command_locked(const std::vector<std::string_view>& args);

  const remote_directory_options options_;
  std::mutex mutex_;
  redisContext* context_ = nullptr;  // guarded by mutex_
  // Each script's digest, as the server gave it when it loaded it; empty
  // before, and after the server said it lost it. Guarded by mutex_.
  std::array<std::string, script_slots> digests_;
  bool load_refused_ = false;  // guarded by mutex_
};

}  // namespace dlasync::remote_detail
