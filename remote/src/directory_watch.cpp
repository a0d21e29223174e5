#include "remote/src/directory_watch.hpp"

#include <poll.h>
#include <sys/time.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dlasync::remote_detail {
namespace {

timeval as_timeval(std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  return tv;
}

}  // namespace

absl::Status unreachable(const remote_directory_options& options, std::string_view what) {
  return absl::UnavailableError(
      absl::StrCat("the directory's Redis server at ", options.address, " port ", options.port,
                   " cannot be reached: ", absl::string_view(what.data(), what.size())));
}

absl::StatusOr<redisContext*> connect_redis(const remote_directory_options& options) {
  redisContext* c = redisConnectWithTimeout(options.address.c_str(), options.port,
                                            as_timeval(options.io_timeout));
  if (c == nullptr) return unreachable(options, "out of memory");
  if (c->err != 0) {
    absl::Status s = unreachable(options, c->errstr);
    redisFree(c);
    return s;
  }
  if (redisSetTimeout(c, as_timeval(options.io_timeout)) != REDIS_OK) {
    redisFree(c);
    return unreachable(options, "its timeout cannot be set");
  }
  return c;
}

absl::StatusOr<std::unique_ptr<directory_watch>> directory_watch::open(
    const remote_directory_options& options, const std::string& channel) {
  absl::StatusOr<redisContext*> c = connect_redis(options);
  if (!c.ok()) return c.status();
  std::unique_ptr<directory_watch> w(new directory_watch(*c));
  const char* argv[] = {"SUBSCRIBE", channel.data()};
  const std::size_t lengths[] = {9, channel.size()};
  auto* r = static_cast<redisReply*>(redisCommandArgv(*c, 2, argv, lengths));
  if (r == nullptr) return unreachable(options, (*c)->errstr);
  // The confirmation: ["subscribe", channel, 1].
  const bool confirmed = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                         r->element[0]->type == REDIS_REPLY_STRING &&
                         absl::string_view(r->element[0]->str, r->element[0]->len) == "subscribe";
  freeReplyObject(r);
  if (!confirmed) {
    return absl::FailedPreconditionError(
        "the directory's Redis server did not confirm a subscription (pub/sub refused?)");
  }
  return w;
}

directory_watch::~directory_watch() {
  redisFree(context_);
}

bool directory_watch::drain() {
  bool seen = false;
  for (;;) {
    void* reply = nullptr;
    if (redisReaderGetReply(context_->reader, &reply) != REDIS_OK) {
      broken_ = true;  // bytes that are no reply: listened to no more
      return true;
    }
    if (reply == nullptr) return seen;
    freeReplyObject(reply);  // the server's words are not looked at: a cue
    seen = true;
  }
}

void directory_watch::changed(std::chrono::milliseconds wait) {
  if (broken_ || drain()) return;
  pollfd p{context_->fd, POLLIN, 0};
  // At most a day a call: the count fits poll's int.
  const auto ms = std::min<std::chrono::milliseconds::rep>(wait.count(), 86400000);
  if (::poll(&p, 1, static_cast<int>(std::max<decltype(ms)>(ms, 0))) <= 0) return;
  if (redisBufferRead(context_) != REDIS_OK) {
    broken_ = true;  // closed or failed: the caller's next look tells
    return;
  }
  (void)drain();
}

}  // namespace dlasync::remote_detail
