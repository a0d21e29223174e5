#include "remote/src/directory_watch.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "remote/src/directory_store.hpp"

namespace dlasync::remote_detail {

absl::StatusOr<std::unique_ptr<directory_watch>> directory_watch::open(
    const remote_directory_options& options) {
  absl::StatusOr<redisContext*> c = connect_redis(options);
  if (!c.ok()) return c.status();
  return std::unique_ptr<directory_watch>(new directory_watch(*c));
}

directory_watch::~directory_watch() {
  redisFree(context_);
}

void directory_watch::send(const char* command, const std::string& channel) {
  if (broken_) return;
  const char* argv[] = {command, channel.data()};
  const std::size_t lengths[] = {std::strlen(command), channel.size()};
  if (redisAppendCommandArgv(context_, 2, argv, lengths) != REDIS_OK) {
    broken_ = true;
    return;
  }
  // The socket blocks, each write bounded by io_timeout.
  for (int done = 0; done == 0;) {
    if (redisBufferWrite(context_, &done) != REDIS_OK) {
      broken_ = true;
      return;
    }
  }
}

void directory_watch::subscribe(const std::string& channel) {
  send("SUBSCRIBE", channel);
}

void directory_watch::unsubscribe(const std::string& channel) {
  send("UNSUBSCRIBE", channel);
}

directory_watch::heard directory_watch::read() {
  heard h;
  if (broken_) return h;
  char chunk[16384];
  const ssize_t n = ::read(context_->fd, chunk, sizeof(chunk));
  if (n < 0 && errno == EINTR) return h;
  // Closed, failed, or a reply longer than any message of the directory's
  // (hiredis would buffer it all): listened to no more.
  unfinished_ += n > 0 ? static_cast<std::size_t>(n) : 0;
  if (n <= 0 || unfinished_ > max_message_bytes ||
      redisReaderFeed(context_->reader, chunk, static_cast<std::size_t>(n)) != REDIS_OK) {
    broken_ = true;
    return h;
  }
  for (;;) {
    void* raw = nullptr;
    if (redisGetReplyFromReader(context_, &raw) != REDIS_OK) {
      broken_ = true;  // bytes that are no reply: listened to no more
      return h;
    }
    if (raw == nullptr) return h;
    // Bytes left over belong to the next reply.
    unfinished_ = context_->reader->len - context_->reader->pos;
    auto* r = static_cast<redisReply*>(raw);
    // ["subscribe", channel, count] and ["message", channel, payload] cue
    // the channel's name; ["unsubscribe", ...] and anything else do not.
    if (r->type == REDIS_REPLY_ERROR) {
      // Pub/sub not allowed here (an ACL, a command renamed away): poll.
      // Any other error (too many clients) ends this connection only.
      const absl::string_view text(r->str, r->len);
      if (absl::StartsWith(text, "NOPERM") || absl::StrContains(text, "unknown command")) {
        h.refused = true;
      } else {
        broken_ = true;
      }
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
               r->element[0]->type == REDIS_REPLY_STRING &&
               r->element[1]->type == REDIS_REPLY_STRING) {
      const absl::string_view kind(r->element[0]->str, r->element[0]->len);
      if (kind == "subscribe" || kind == "message") {
        h.cues.emplace_back(r->element[1]->str, r->element[1]->len);
      }
    }
    freeReplyObject(r);
  }
}

}  // namespace dlasync::remote_detail
