#include "remote/src/directory_watch.hpp"

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
  if (redisBufferRead(context_) != REDIS_OK) {
    broken_ = true;  // closed or failed
    return h;
  }
  for (;;) {
    void* raw = nullptr;
    if (redisGetReplyFromReader(context_, &raw) != REDIS_OK) {
      broken_ = true;  // bytes that are no reply: listened to no more
      return h;
    }
    if (raw == nullptr) return h;
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
