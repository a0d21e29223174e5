// `remote_directory::impl` (internal): what a directory holds (its
// options, its one connection to Redis, the loop that serves its waits, the
// thread its withdrawals run on), shared by directory.cpp (names: put,
// find, wait, withdraw) and directory_named.cpp (the awaitable import by
// name), and the wait both of them start.
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "asio/thread_pool.hpp"
#include "dlasync/remote_directory.hpp"
#include "remote/src/directory_store.hpp"
#include "remote/src/directory_waits.hpp"

namespace dlasync {

class remote_directory::impl {
 public:
  explicit impl(remote_directory_options o)
      : options(std::move(o)), store(options), waits(options, remote_directory::max_waits) {}
  ~impl() {
    waits.stop();
    pool.join();
  }

  absl::StatusOr<remote_detail::reply_ptr> command(const std::vector<std::string_view>& args) {
    return store.command(args);
  }

  std::string key(std::string_view name) const {
    return absl::StrCat(options.prefix, absl::string_view(name.data(), name.size()));
  }

  const remote_directory_options options;
  remote_detail::redis_store store;
  // Every wait, on one thread and one subscription; its looks use the
  // store, so it goes first.
  remote_detail::directory_waits waits;
  // Where put_while_published's withdrawals run, off the runtime's threads.
  asio::thread_pool pool{1};
};

namespace remote_detail {

using entry_fn = absl::AnyInvocable<void(absl::StatusOr<remote_entry>) &&>;

// Adds a wait (directory_waits) for `name` to hold an entry, for `wait`:
// `done` is told once, on the directory's loop (or here when refused at
// once), with the entry, or the directory's error (DeadlineExceeded,
// Cancelled, ResourceExhausted, Unavailable, what find refuses). Its id,
// for directory_waits::cancel, or 0 when refused at once.
std::uint64_t await_entry(remote_directory::impl& d, const std::string& name,
                          std::chrono::milliseconds wait, entry_fn done);

}  // namespace remote_detail
}  // namespace dlasync
