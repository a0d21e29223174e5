// Names for publications, in Redis (dlasync/remote_directory.hpp), through
// hiredis's blocking client: one connection a directory, one command at a
// time, each bounded by io_timeout, scripts by their digest
// (directory_store.hpp). Every wait of a directory (wait_for,
// wait_withdrawn, import_remote_named) is a look and an end on the
// directory's wait loop, one thread and one subscription to the channels of
// the names waited for, on which puts and withdrawals publish
// (directory_waits.hpp).
// A name put while published is withdrawn by a job on the directory's
// thread that the publication's end queues, if the directory is still there.
#include "dlasync/remote_directory.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "asio/post.hpp"
#include "asio/thread_pool.hpp"
#include "remote/src/directory_impl.hpp"

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

// A withdrawal's reply that is no count: the server's refusal (an error
// reply: a replica, an ACL, out of memory) is Unavailable with its words; a
// key of another type (WRONGTYPE), or a reply of another type, DataLoss.
absl::Status not_withdrawn(std::string_view name, const redisReply& reply) {
  if (reply.type == REDIS_REPLY_ERROR &&
      !absl::StrContains(absl::string_view(reply.str, reply.len), "WRONGTYPE")) {
    return absl::UnavailableError(absl::StrCat("the directory's server refused to withdraw \"",
                                               av(name),
                                               "\": ", absl::string_view(reply.str, reply.len)));
  }
  return no_entry_string(name, reply, "nothing was withdrawn");
}

absl::Status nothing_under(std::string_view name) {
  return absl::NotFoundError(absl::StrCat("the directory holds nothing under \"", av(name), "\""));
}

}  // namespace

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
  // The waits under way end here (Cancelled), and the withdrawals queued
  // run (each bounded by io_timeout); those queued later find the thread
  // gone, and the directory with it.
  impl_->waits.stop();
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

namespace {

absl::StatusOr<remote_entry> find_in(remote_directory::impl& d, std::string_view name) {
  if (absl::Status s = check_name(name); !s.ok()) return s;
  const std::string key = d.key(name);
  // At most one byte past the bound: an honest server sends no more.
  const std::string last = std::to_string(remote_directory::max_entry_bytes);
  absl::StatusOr<reply_ptr> r = d.command({"GETRANGE", key, "0", last});
  if (!r.ok()) return r.status();
  const redisReply& reply = **r;
  if (reply.type != REDIS_REPLY_STRING) {
    return no_entry_string(name, reply, "something else wrote that key");
  }
  if (reply.len > remote_directory::max_entry_bytes) {
    return absl::OutOfRangeError(
        absl::StrCat("the directory's entry under \"", av(name), "\" is longer than the ",
                     remote_directory::max_entry_bytes, " bytes an entry may have"));
  }
  const std::string_view bytes(reply.str, reply.len);
  if (bytes.empty()) {
    // GETRANGE gives nothing for a missing key, and for an empty string.
    absl::StatusOr<reply_ptr> e = d.command({"EXISTS", key});
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
  absl::StatusOr<remote_descriptor> one = remote_descriptor::decode(bytes);
  if (!one.ok()) return one.status();
  return remote_entry(*std::move(one));
}

using wait_clock = remote_detail::directory_waits::clock;

// `wait` from now; the end of time for a wait too long to add.
wait_clock::time_point deadline_after(std::chrono::milliseconds wait) {
  const auto now = wait_clock::now();
  if (wait.count() <= 0) return now;
  const auto room =
      std::chrono::duration_cast<std::chrono::milliseconds>(wait_clock::time_point::max() - now);
  return wait >= room ? wait_clock::time_point::max() : now + wait;
}

}  // namespace

namespace remote_detail {

std::uint64_t await_entry(remote_directory::impl& d, const std::string& name,
                          std::chrono::milliseconds wait, entry_fn done) {
  if (absl::Status s = check_name(name); !s.ok()) {
    std::move(done)(std::move(s));
    return 0;
  }
  // Shared by the look and the end, both on the loop's thread.
  auto found = std::make_shared<absl::StatusOr<remote_entry>>(absl::NotFoundError(""));
  std::string key = d.key(name);
  return d.waits.add(
      std::move(key), deadline_after(wait),
      [&d, name, found](wait_clock::time_point&) {
        *found = find_in(d, name);
        return found->ok() || found->status().code() != absl::StatusCode::kNotFound;
      },
      [found, name, wait, done = std::move(done)](absl::Status why) mutable {
        if (why.ok()) return std::move(done)(std::move(*found));
        if (why.code() == absl::StatusCode::kDeadlineExceeded) {
          why = absl::DeadlineExceededError(absl::StrCat(
              "nothing appeared under \"", name, "\" in the directory within ", wait.count(),
              " ms; the exporter has not published it yet, or under another name"));
        }
        std::move(done)(std::move(why));
      });
}

}  // namespace remote_detail

absl::StatusOr<remote_entry> remote_directory::find(std::string_view name) {
  return find_in(*impl_, name);
}

absl::StatusOr<remote_entry> remote_directory::wait_for(std::string_view name,
                                                        std::chrono::milliseconds wait) {
  std::promise<absl::StatusOr<remote_entry>> result;
  std::future<absl::StatusOr<remote_entry>> told = result.get_future();
  remote_detail::await_entry(
      *impl_, std::string(name), wait,
      [&result](absl::StatusOr<remote_entry> e) { result.set_value(std::move(e)); });
  return told.get();
}

absl::Status remote_directory::wait_withdrawn(std::string_view name,
                                              std::chrono::milliseconds wait) {
  if (absl::Status s = check_name(name); !s.ok()) return s;
  auto failed = std::make_shared<absl::Status>();
  std::promise<absl::Status> result;
  std::future<absl::Status> told = result.get_future();
  std::string key = impl_->key(name);
  impl_->waits.add(
      key, deadline_after(wait),
      [d = impl_.get(), key, failed](wait_clock::time_point& due) {
        absl::StatusOr<reply_ptr> r = d->command({"PTTL", key});
        if (!r.ok()) {
          *failed = r.status();
          return true;
        }
        // -2: no such key; -1: no ttl (not put by a directory).
        if ((*r)->type != REDIS_REPLY_INTEGER) return false;
        if ((*r)->integer == -2) return true;
        // When the ttl runs out (its lease's end), which publishes nothing;
        // at most a day: a hostile reply cannot overflow the time.
        constexpr long long day_ms = 86400000;
        if ((*r)->integer >= 0) {
          due = wait_clock::now() + std::chrono::milliseconds(std::min((*r)->integer, day_ms) + 1);
        }
        return false;
      },
      [&result, failed, name = std::string(name), wait](absl::Status why) {
        if (why.code() == absl::StatusCode::kDeadlineExceeded) {
          why = absl::DeadlineExceededError(
              absl::StrCat("\"", name, "\" is still in the directory after ", wait.count(), " ms"));
        }
        result.set_value(why.ok() ? *failed : why);
      });
  return told.get();
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
  if (reply.type != REDIS_REPLY_INTEGER) return not_withdrawn(name, reply);
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
  if (exporter_address != node.advertised_address() || exporter_port != node.listen_port()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the entry's exporter is ", exporter_address, " port ", exporter_port,
                     ", not the node given (", node.advertised_address(), " port ",
                     node.listen_port(), "); give put_while_published the node that published it"));
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
  if ((*r)->type != REDIS_REPLY_INTEGER) return not_withdrawn(name, **r);
  if ((*r)->integer == 0) return nothing_under(name);
  return absl::OkStatus();
}

}  // namespace dlasync
