// Names for publications, in Redis (dlasync/remote_directory.hpp), through
// hiredis's blocking client: one connection a directory, one command at a
// time, each bounded by io_timeout, scripts by their digest
// (directory_store.hpp). A wait that finds nothing at first
// subscribes to the name's channel on a connection of its own
// (directory_watch.hpp), on which puts and withdrawals publish; an
// awaitable import's wait blocks a thread of its own (directory_waits.hpp).
// A name put while published is withdrawn by a job on the directory's
// thread that the publication's end queues, if the directory is still there.
#include "dlasync/remote_directory.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "asio/associated_executor.hpp"
#include "asio/async_result.hpp"
#include "asio/execution/outstanding_work.hpp"
#include "asio/post.hpp"
#include "asio/prefer.hpp"
#include "asio/thread_pool.hpp"
#include "asio/use_awaitable.hpp"
#include "remote/src/directory_store.hpp"
#include "remote/src/directory_waits.hpp"
#include "remote/src/directory_watch.hpp"

namespace dlasync {
namespace {

using remote_detail::reply_ptr;

// absl's own string_view (Debian's abseil does not use std::string_view).
absl::string_view av(std::string_view s) {
  return {s.data(), s.size()};
}

absl::Status check_name(std::string_view name) {
  if (name.empty() || name.size() > remote_directory::max_name_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a directory name of ", name.size(),
                                                   " bytes; names have 1 to ",
                                                   remote_directory::max_name_bytes));
  }
  return absl::OkStatus();
}

// DataLoss for a key that holds no entry's string (Redis's error, or a
// reply of another type), and what that means for the command (`then`).
absl::Status no_entry_string(std::string_view name, const redisReply& reply,
                             std::string_view then) {
  return absl::DataLossError(
      absl::StrCat("the directory holds no entry's string under \"", av(name), "\" (Redis: ",
                   reply.type == REDIS_REPLY_ERROR ? absl::string_view(reply.str, reply.len)
                                                   : absl::string_view("a reply of another type"),
                   "); ", av(then)));
}

absl::Status nothing_under(std::string_view name) {
  return absl::NotFoundError(absl::StrCat("the directory holds nothing under \"", av(name), "\""));
}

}  // namespace

class remote_directory::impl {
 public:
  explicit impl(remote_directory_options o) : options(std::move(o)), store(options) {}
  ~impl() {
    waits.join();
    pool.join();
  }

  absl::StatusOr<reply_ptr> command(const std::vector<std::string_view>& args) {
    return store.command(args);
  }

  std::string key(std::string_view name) const { return absl::StrCat(options.prefix, av(name)); }

  const remote_directory_options options;
  remote_detail::redis_store store;
  // Where put_while_published's withdrawals run, off the runtime's threads.
  asio::thread_pool pool{1};
  // Where the awaitable imports wait, each on a thread of its own.
  remote_detail::wait_threads waits{remote_directory::max_waits};
};

absl::StatusOr<std::unique_ptr<remote_directory>> remote_directory::connect(
    remote_directory_options options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError(
        "remote_directory_options::address is empty; name the Redis server");
  }
  if (options.io_timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote_directory_options::io_timeout = ", options.io_timeout.count(),
                     " ms: it must be above 0"));
  }
  if (options.recheck.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote_directory_options::recheck = ", options.recheck.count(),
                     " ms: it must be above 0"));
  }
  auto i = std::make_shared<impl>(std::move(options));
  if (absl::Status s = i->store.connect(); !s.ok()) return s;
  return std::unique_ptr<remote_directory>(new remote_directory(std::move(i)));
}

remote_directory::remote_directory(std::shared_ptr<impl> impl) noexcept : impl_(std::move(impl)) {}

remote_directory::~remote_directory() {
  // The waits under way end here (each bounded by its wait), and the
  // withdrawals queued (each bounded by io_timeout); those queued later find
  // the thread gone, and the directory with it.
  impl_->waits.join();
  impl_->pool.join();
}

const remote_directory_options& remote_directory::options() const noexcept {
  return impl_->options;
}

namespace {

// Puts KEYS[1] = ARGV[1] for ARGV[2] ms unless it holds something, and says
// so on the key's channel (directory_watch.hpp): OK, or nil when taken. The
// message is a courtesy: a server that refuses it (pcall) still keeps the
// entry, and the put still succeeds.
constexpr remote_detail::lua_script put_and_publish{
    R"(local ok = redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX')
if ok then redis.pcall('PUBLISH', KEYS[1], 'put') end
return ok)",
    0};

absl::Status put_bytes(remote_directory::impl& d, std::string_view name, const std::string& bytes,
                       std::chrono::milliseconds ttl) {
  if (absl::Status s = check_name(name); !s.ok()) return s;
  if (ttl.count() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("a directory entry's ttl of ", ttl.count(),
                                                   " ms; give it the lease, above 0"));
  }
  const std::string key = d.key(name);
  const std::string ms = std::to_string(ttl.count());
  absl::StatusOr<reply_ptr> r = d.store.run(put_and_publish, {"1", key, bytes, ms});
  if (!r.ok()) return r.status();
  if ((*r)->type == REDIS_REPLY_NIL) {
    return absl::AlreadyExistsError(absl::StrCat("the name \"", av(name),
                                                 "\" is taken in the directory; choose another, or "
                                                 "withdraw it first"));
  }
  if ((*r)->type == REDIS_REPLY_STATUS) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("the directory's server refused the entry: ",
                                             absl::string_view((*r)->str, (*r)->len)));
}

}  // namespace

absl::Status remote_directory::put(std::string_view name, const remote_descriptor& descriptor,
                                   std::chrono::milliseconds ttl) {
  return put_bytes(*impl_, name, descriptor.encode(), ttl);
}

absl::Status remote_directory::put(std::string_view name, const remote_bundle& bundle,
                                   std::chrono::milliseconds ttl) {
  return put_bytes(*impl_, name, bundle.encode(), ttl);
}

absl::StatusOr<remote_entry> remote_directory::find(std::string_view name) {
  if (absl::Status s = check_name(name); !s.ok()) return s;
  const std::string key = impl_->key(name);
  // At most one byte past the bound: an honest server sends no more.
  const std::string last = std::to_string(max_entry_bytes);
  absl::StatusOr<reply_ptr> r = impl_->command({"GETRANGE", key, "0", last});
  if (!r.ok()) return r.status();
  const redisReply& reply = **r;
  if (reply.type != REDIS_REPLY_STRING) {
    return no_entry_string(name, reply, "something else wrote that key");
  }
  if (reply.len > max_entry_bytes) {
    return absl::OutOfRangeError(absl::StrCat("the directory's entry under \"", av(name),
                                              "\" is longer than the ", max_entry_bytes,
                                              " bytes an entry may have"));
  }
  const std::string_view bytes(reply.str, reply.len);
  if (bytes.empty()) {
    // GETRANGE gives nothing for a missing key, and for an empty string.
    absl::StatusOr<reply_ptr> e = impl_->command({"EXISTS", key});
    if (!e.ok()) return e.status();
    if ((*e)->type == REDIS_REPLY_INTEGER && (*e)->integer == 0) {
      return absl::NotFoundError(absl::StrCat("the directory holds nothing under \"", av(name),
                                              "\": never put, withdrawn, or its lease ended"));
    }
    return absl::DataLossError(
        absl::StrCat("the directory holds an empty string under \"", av(name), "\", no entry"));
  }
  if (bytes.substr(0, 4) == "DLRB") {
    absl::StatusOr<remote_bundle> b = remote_bundle::decode(bytes);
    if (!b.ok()) return b.status();
    return remote_entry(*std::move(b));
  }
  absl::StatusOr<remote_descriptor> d = remote_descriptor::decode(bytes);
  if (!d.ok()) return d.status();
  return remote_entry(*std::move(d));
}

namespace {

// A watch of `name`'s channel, opened within `wait` (and io_timeout):
// Unavailable where the server cannot be reached in time (the wait polls,
// and tries again later), FailedPrecondition where it refuses pub/sub (the
// wait polls).
absl::StatusOr<std::unique_ptr<remote_detail::directory_watch>> watch_of(
    const remote_directory::impl& d, std::string_view name, std::chrono::milliseconds wait) {
  remote_directory_options o = d.options;
  o.io_timeout = std::min(o.io_timeout, wait);
  return remote_detail::directory_watch::open(o, d.key(name));
}

// Calls `look` until it says true or `until` has passed (false then). Only
// once the first look says false does it watch `name` (watch_of, within the
// time left), and looks at once again, so a change between the first look
// and the subscription is seen. Then again when the watch sees the name
// change, after the directory's recheck, or when `next_due()` has passed,
// whichever comes first; without a watch, every 1 ms at first and every
// 50 ms at most (or at next_due()). A watch whose connection breaks, or
// that could not be made, is made again (at most once in 100 ms; a server
// that refuses pub/sub is not asked again); each new watch is followed by
// a look, as the first is.
bool look_until(const remote_directory::impl& d, std::string_view name,
                std::chrono::steady_clock::time_point until,
                absl::FunctionRef<std::chrono::milliseconds()> next_due,
                absl::FunctionRef<bool()> look) {
  using std::chrono::milliseconds;
  using clock = std::chrono::steady_clock;
  std::unique_ptr<remote_detail::directory_watch> watch;
  bool refused = false;  // pub/sub refused: poll
  // When a watch may be made (again): at the first look that finds nothing.
  clock::time_point next_watch = clock::time_point::min();
  auto backoff = milliseconds(1);
  for (;;) {
    if (look()) return true;
    const auto now = clock::now();
    if (now >= until) return false;
    // Rounded up: a pause of 0 would spin.
    const auto left = std::chrono::ceil<milliseconds>(until - now);
    if (watch != nullptr && watch->broken()) {
      watch.reset();  // nothing comes on it any more: watch again
      backoff = milliseconds(1);
    }
    if (watch == nullptr && !refused && now >= next_watch) {
      // However this one ends, the next comes no sooner than 100 ms (or a
      // recheck, when shorter): a server that closes every subscription
      // at once is not asked in a loop.
      next_watch = now + std::min(d.options.recheck, milliseconds(100));
      absl::StatusOr<std::unique_ptr<remote_detail::directory_watch>> w = watch_of(d, name, left);
      if (w.ok()) {
        watch = *std::move(w);
      } else {
        refused = w.status().code() == absl::StatusCode::kFailedPrecondition;
      }
      continue;  // look again: a change before the subscription is seen
    }
    const milliseconds pause =
        std::min({watch != nullptr ? d.options.recheck : backoff, left, next_due()});
    if (watch != nullptr) {
      watch->changed(pause);
    } else {
      std::this_thread::sleep_for(pause);
      backoff = std::min(backoff * 2, milliseconds(50));
    }
  }
}

constexpr std::chrono::milliseconds no_due = std::chrono::milliseconds::max();

}  // namespace

absl::StatusOr<remote_entry> remote_directory::wait_for(std::string_view name,
                                                        std::chrono::milliseconds wait) {
  // The wait's end, from the call: DeadlineExceeded never comes sooner.
  // Most waits find the name at the first look: no subscription for them.
  const auto until = std::chrono::steady_clock::now() + wait;
  absl::StatusOr<remote_entry> e = absl::NotFoundError("");
  const bool ended = look_until(
      *impl_, name, until, [] { return no_due; },
      [&] {
        e = find(name);
        return e.ok() || e.status().code() != absl::StatusCode::kNotFound;
      });
  if (ended) return e;
  return absl::DeadlineExceededError(absl::StrCat(
      "nothing appeared under \"", av(name), "\" in the directory within ", wait.count(),
      " ms; the exporter has not published it yet, or under another name"));
}

absl::Status remote_directory::wait_withdrawn(std::string_view name,
                                              std::chrono::milliseconds wait) {
  if (absl::Status s = check_name(name); !s.ok()) return s;
  const std::string key = impl_->key(name);
  absl::Status failed;
  // When the ttl the server last reported runs out (its lease's end).
  std::chrono::milliseconds due = no_due;
  auto gone = [&] {
    absl::StatusOr<reply_ptr> r = impl_->command({"PTTL", key});
    if (!r.ok()) {
      failed = r.status();
      return true;
    }
    // -2: no such key; -1: no ttl (not put by a directory).
    if ((*r)->type != REDIS_REPLY_INTEGER) return false;
    if ((*r)->integer == -2) return true;
    // At most a day: a hostile reply cannot overflow the pause.
    constexpr long long day_ms = 86400000;
    due = (*r)->integer >= 0 ? std::chrono::milliseconds(std::min((*r)->integer, day_ms) + 1)
                             : no_due;
    return false;
  };
  const bool ended = look_until(
      *impl_, name, std::chrono::steady_clock::now() + wait, [&] { return due; }, gone);
  if (!failed.ok()) return failed;
  if (ended) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("\"", av(name), "\" is still in the directory after ", wait.count(), " ms"));
}

namespace {

// Deletes KEYS[1] only while it holds ARGV[1], in one step on the server,
// and says so on its channel: 1 when deleted, 0 when it held nothing, -1
// when it holds another value.
constexpr remote_detail::lua_script withdraw_if_holds{R"(local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall('PUBLISH', KEYS[1], 'withdrawn')
  return 1
end
return -1)",
                                                      1};

// Deletes KEYS[1] and, when it held something, says so on its channel: the
// keys deleted.
constexpr remote_detail::lua_script withdraw_and_publish{R"(local n = redis.call('DEL', KEYS[1])
if n > 0 then redis.pcall('PUBLISH', KEYS[1], 'withdrawn') end
return n)",
                                                         2};

absl::Status withdraw_bytes(remote_directory::impl& d, std::string_view name,
                            const std::string& bytes) {
  if (absl::Status s = check_name(name); !s.ok()) return s;
  absl::StatusOr<reply_ptr> r = d.store.run(withdraw_if_holds, {"1", d.key(name), bytes});
  if (!r.ok()) return r.status();
  const redisReply& reply = **r;
  if (reply.type != REDIS_REPLY_INTEGER)
    return no_entry_string(name, reply, "nothing was withdrawn");
  if (reply.integer == 0) return nothing_under(name);
  if (reply.integer < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the directory holds another entry under \"", av(name),
                     "\" than the one given (put there since, by another exporter); it stays"));
  }
  return absl::OkStatus();
}

absl::Status put_while_published_bytes(const std::shared_ptr<remote_directory::impl>& d,
                                       remote_node& node, std::string_view name,
                                       const std::string& bytes, std::uint64_t lease_id,
                                       const std::string& exporter_address,
                                       std::uint16_t exporter_port, std::chrono::milliseconds ttl) {
  if (exporter_address != node.listen_address() || exporter_port != node.listen_port()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the entry's exporter is ", exporter_address, " port ", exporter_port,
                     ", not the node given (", node.listen_address(), " port ", node.listen_port(),
                     "); give put_while_published the node that published it"));
  }
  if (absl::Status s = put_bytes(*d, name, bytes, ttl); !s.ok()) return s;
  std::function<void(publication_end)> withdraw_at_end =
      [weak = std::weak_ptr<remote_directory::impl>(d), name = std::string(name),
       bytes](publication_end) {
        std::shared_ptr<remote_directory::impl> alive = weak.lock();
        if (alive == nullptr) return;
        // Redis is slow to the runtime's threads: the directory's waits.
        asio::post(alive->pool, [weak, name, bytes] {
          if (std::shared_ptr<remote_directory::impl> still = weak.lock()) {
            (void)withdraw_bytes(*still, name, bytes);  // the ttl ends what this cannot
          }
        });
      };
  absl::Status watched = node.when_ended(lease_id, std::move(withdraw_at_end));
  if (watched.code() == absl::StatusCode::kNotFound) {
    (void)withdraw_bytes(*d, name, bytes);
    return absl::NotFoundError(absl::StrCat(
        "the publication under lease ", lease_id, " ended before it was named \"", av(name),
        "\" (released by its importers, or its lease ended): the name was withdrawn again"));
  }
  return watched;
}

}  // namespace

absl::Status remote_directory::put_while_published(remote_node& node, std::string_view name,
                                                   const remote_descriptor& descriptor,
                                                   std::chrono::milliseconds ttl) {
  return put_while_published_bytes(impl_, node, name, descriptor.encode(), descriptor.lease_id,
                                   descriptor.exporter_address, descriptor.exporter_port, ttl);
}

absl::Status remote_directory::put_while_published(remote_node& node, std::string_view name,
                                                   const remote_bundle& bundle,
                                                   std::chrono::milliseconds ttl) {
  return put_while_published_bytes(impl_, node, name, bundle.encode(), bundle.lease_id,
                                   bundle.exporter_address, bundle.exporter_port, ttl);
}

absl::Status remote_directory::withdraw(std::string_view name,
                                        const remote_descriptor& descriptor) {
  return withdraw_bytes(*impl_, name, descriptor.encode());
}

absl::Status remote_directory::withdraw(std::string_view name, const remote_bundle& bundle) {
  return withdraw_bytes(*impl_, name, bundle.encode());
}

absl::Status remote_directory::withdraw(std::string_view name) {
  if (absl::Status s = check_name(name); !s.ok()) return s;
  absl::StatusOr<reply_ptr> r = impl_->store.run(withdraw_and_publish, {"1", impl_->key(name)});
  if (!r.ok()) return r.status();
  if ((*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 0) return nothing_under(name);
  return absl::OkStatus();
}

#if defined(ASIO_HAS_CO_AWAIT)
asio::awaitable<absl::StatusOr<std::vector<tensor>>> import_remote_named(
    remote_node& node, remote_directory& directory, std::string name,
    std::chrono::milliseconds wait, remote_import_options options) {
  // The wait blocks a thread of its own, never the runtime's, nor another
  // wait's; its result comes back on the coroutine's executor.
  absl::StatusOr<remote_entry> entry =
      co_await asio::async_initiate<const asio::use_awaitable_t<>&,
                                    void(absl::StatusOr<remote_entry>)>(
          [&directory, &name, wait](auto handler) {
            auto ex = asio::prefer(asio::get_associated_executor(handler),
                                   asio::execution::outstanding_work.tracked);
            directory.get_impl().waits.run(
                [&directory, name, wait, ex, handler = std::move(handler)](
                    absl::Status admitted) mutable -> remote_detail::wait_threads::then_fn {
                  absl::StatusOr<remote_entry> found =
                      admitted.ok() ? directory.wait_for(name, wait) : std::move(admitted);
                  // Posted once the wait's thread is free (wait_threads).
                  return [ex, handler = std::move(handler), found = std::move(found)]() mutable {
                    asio::post(ex,
                               [handler = std::move(handler), found = std::move(found)]() mutable {
                                 std::move(handler)(std::move(found));
                               });
                  };
                });
          },
          asio::use_awaitable);
  if (!entry.ok()) co_return entry.status();
  if (auto* d = std::get_if<remote_descriptor>(&*entry)) {
    absl::StatusOr<tensor> t = co_await import_remote(node, *d, options);
    if (!t.ok()) co_return t.status();
    std::vector<tensor> one;
    one.push_back(*std::move(t));
    co_return one;
  }
  co_return co_await import_remote_bundle(node, std::get<remote_bundle>(*std::move(entry)),
                                          options);
}
#endif

}  // namespace dlasync
