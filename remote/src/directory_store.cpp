#include "remote/src/directory_store.hpp"

#include <poll.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dlasync::remote_detail {
namespace {

timeval as_timeval(std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  return tv;
}

// A digest as SCRIPT LOAD gives it: 40 hex digits. Anything else (the
// store is untrusted) is not sent back.
bool is_digest(const redisReply& r) {
  if (r.type != REDIS_REPLY_STRING || r.len != 40) return false;
  return std::all_of(r.str, r.str + r.len,
                     [](char c) { return absl::ascii_isxdigit(static_cast<unsigned char>(c)); });
}

// hiredis's own reply functions, and a table of them whose arrays are
// bounded: hiredis allocates an array's element pointers as its header
// announces them ("*2147483647" is 16 GiB), before any element comes. The
// directory's replies hold at most 3 elements; a longer array makes the
// reader fail (out of memory), which the caller takes as no reply.
struct bounded_replies {
  const redisReplyObjectFunctions* own = nullptr;
  redisReplyObjectFunctions table{};
};

constexpr int max_reply_elements = 16;

void* bounded_array(const redisReadTask* task, int elements);

// Made from the first context's functions (hiredis's, the same for all).
bounded_replies& replies(const redisReplyObjectFunctions* own = nullptr) {
  static bounded_replies r = [own] {
    bounded_replies b;
    b.own = own;
    b.table = *own;
    b.table.createArray = &bounded_array;
    return b;
  }();
  return r;
}

void* bounded_array(const redisReadTask* task, int elements) {
  if (elements < 0 || elements > max_reply_elements) return nullptr;
  return replies().own->createArray(task, elements);
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
  if (c->reader->fn != nullptr) c->reader->fn = &replies(c->reader->fn).table;
  return c;
}

redis_store::~redis_store() {
  if (context_ != nullptr) redisFree(context_);
}

absl::Status redis_store::connect() {
  std::lock_guard lock(mutex_);
  return connect_locked();
}

absl::Status redis_store::connect_locked() {
  if (context_ != nullptr) return absl::OkStatus();
  absl::StatusOr<redisContext*> c = connect_redis(options_);
  if (!c.ok()) return c.status();
  context_ = *c;
  return absl::OkStatus();
}

absl::StatusOr<reply_ptr> redis_store::command(const std::vector<std::string_view>& args) {
  std::lock_guard lock(mutex_);
  return command_locked(args);
}

absl::StatusOr<reply_ptr> redis_store::command_locked(const std::vector<std::string_view>& args) {
  if (absl::Status s = connect_locked(); !s.ok()) return s;
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  // The connection is dropped on any failure: the next command reconnects.
  auto drop = [&](absl::Status why) {
    redisFree(std::exchange(context_, nullptr));
    return why;
  };
  if (redisAppendCommandArgv(context_, static_cast<int>(argv.size()), argv.data(),
                             lengths.data()) != REDIS_OK) {
    return drop(unreachable(options_, context_->errstr));
  }
  // The whole command, written and answered, within io_timeout (at most a
  // day): a server that trickles its reply a byte at a time is cut off too.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::min(options_.io_timeout, std::chrono::milliseconds(86400000));
  auto ready = [&](short events) {
    for (;;) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{context_->fd, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r >= 0) return r > 0;  // readable or writable, or an error the call reports
      if (errno != EINTR) return true;
    }
  };
  auto late = [&] {
    return unreachable(options_, absl::StrCat("no reply within io_timeout (",
                                              options_.io_timeout.count(), " ms)"));
  };
  for (int written = 0; written == 0;) {
    if (!ready(POLLOUT)) return drop(late());
    if (redisBufferWrite(context_, &written) != REDIS_OK) {
      return drop(unreachable(options_, context_->errstr));
    }
  }
  // The reply, read here rather than by hiredis, which would buffer all a
  // server sends for it: past max_reply_bytes the server is cut off. Every
  // reply ends a line, so it is looked for only after a line's end came.
  std::size_t read = 0;
  bool line_ended = true;
  for (;;) {
    if (line_ended) {
      void* reply = nullptr;
      if (redisGetReplyFromReader(context_, &reply) != REDIS_OK) {
        return drop(absl::DataLossError(
            absl::StrCat("the directory's Redis server at ", options_.address, " port ",
                         options_.port, " sent bytes that are no reply of the directory's (",
                         context_->errstr, "); the connection was dropped")));
      }
      if (reply != nullptr) return reply_ptr(static_cast<redisReply*>(reply));
    }
    if (read > max_reply_bytes) {
      return drop(absl::DataLossError(absl::StrCat(
          "the directory's Redis server at ", options_.address, " port ", options_.port,
          " sent more than ", max_reply_bytes,
          " bytes for one reply, more than any reply of the directory's (an entry is at most ",
          remote_directory::max_entry_bytes, " bytes); the connection was dropped")));
    }
    if (!ready(POLLIN)) return drop(late());
    char chunk[16384];
    const ssize_t n = ::read(context_->fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return drop(unreachable(options_, "it closed the connection"));
    if (n < 0) {
      return drop(
          unreachable(options_, absl::StrCat("reading its reply failed (errno ", errno, ")")));
    }
    read += static_cast<std::size_t>(n);
    line_ended = std::memchr(chunk, '\n', static_cast<std::size_t>(n)) != nullptr;
    if (redisReaderFeed(context_->reader, chunk, static_cast<std::size_t>(n)) != REDIS_OK) {
      return drop(unreachable(options_, "out of memory"));
    }
  }
}

absl::StatusOr<reply_ptr> redis_store::run(const lua_script& script,
                                           const std::vector<std::string_view>& keys_and_args) {
  std::lock_guard lock(mutex_);
  std::vector<std::string_view> args;
  args.reserve(keys_and_args.size() + 2);
  std::string& digest = digests_[script.slot];
  // Twice at most: a digest the server lost is loaded again once.
  for (int attempt = 0; attempt < 2 && !load_refused_; ++attempt) {
    if (digest.empty()) {
      absl::StatusOr<reply_ptr> loaded = command_locked({"SCRIPT", "LOAD", script.text});
      if (!loaded.ok()) return loaded.status();
      if (!is_digest(**loaded)) {
        // Refused for good (an ACL, a command renamed away, a reply that is
        // no digest): every script goes whole from now on. Refused for now
        // (the server is loading, or busy): this one goes whole.
        const redisReply& reply = **loaded;
        const absl::string_view text = reply.type == REDIS_REPLY_ERROR
                                           ? absl::string_view(reply.str, reply.len)
                                           : absl::string_view();
        load_refused_ = reply.type != REDIS_REPLY_ERROR || absl::StartsWith(text, "NOPERM") ||
                        absl::StrContains(text, "unknown");
        break;
      }
      digest.assign((*loaded)->str, (*loaded)->len);
    }
    args.assign({"EVALSHA", digest});
    args.insert(args.end(), keys_and_args.begin(), keys_and_args.end());
    absl::StatusOr<reply_ptr> r = command_locked(args);
    if (!r.ok()) return r.status();
    const redisReply& reply = **r;
    const bool lost = reply.type == REDIS_REPLY_ERROR &&
                      absl::StartsWith(absl::string_view(reply.str, reply.len), "NOSCRIPT");
    if (!lost) return r;
    digest.clear();  // restarted, or flushed: load it again
  }
  args.assign({"EVAL", script.text});
  args.insert(args.end(), keys_and_args.begin(), keys_and_args.end());
  return command_locked(args);
}

}  // namespace dlasync::remote_detail
