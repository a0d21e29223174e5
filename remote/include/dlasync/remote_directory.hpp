// dlasync/remote_directory.hpp
//
// `dlasync::remote_directory` gives publications names, kept in Redis: an
// exporter puts a descriptor (or a bundle) under a name for as long as its
// lease, an importer finds it by the name, or waits for it to appear, and
// imports it (`import_remote_named`). The entry's time to live is the
// lease's, so a dead exporter leaves no name behind past it; with
// put_while_published, a publication that ends sooner (its importers took
// it) takes its name with it then.
//
// The store is untrusted, as any channel a descriptor comes over: what a
// name holds is decoded and validated exactly as a descriptor from anywhere
// else (remote_descriptor::decode, remote_bundle::decode, then the import's
// validation), and an entry that is no string, or larger than
// max_entry_bytes, is refused (an honest server sends at most one byte
// past the bound; one that sends more for one reply is cut off). The directory
// grants nothing by itself: a name leads to a lease, whose exporter
// decides.
//
// Why Redis: Debian 12 ships the server (redis-server 7.0) and a C client
// (hiredis 0.14) that are kept and small; etcd's server is there too, but no
// C or C++ client is packaged. A key holds an entry, with SET ... PX (the
// lease's milliseconds) NX: a name is taken once, and goes with its lease.
//
// Example:
//
//   auto dir = dlasync::remote_directory::connect({.address = "10.0.0.5"});
//   absl::StatusOr<dlasync::remote_bundle> b = node.publish_bundle(batch, lease);
//   (*dir)->put_while_published(node, "batch-17", *b, lease.lease);
//   ...
//   absl::StatusOr<std::vector<dlasync::tensor>> ts = co_await dlasync::import_remote_named(
//       node, **dir, "batch-17", std::chrono::seconds(5));
//
// Thread safety: all members are safe to call from any thread; each call
// blocks its thread for its commands (each bounded by io_timeout, one at a
// time a directory), or the wait it is given. Every wait of a directory
// (wait_for, wait_withdrawn, import_remote_named; at most max_waits at once)
// is served by one thread and one subscription of the directory's, never by
// the runtime's threads; their looks run one at a time, so on a slow server
// a wait may end up to a few io_timeouts past its deadline.
// put_while_published's withdrawals run on another thread of the
// directory's, never behind a wait. The destructor ends the waits under way
// (Cancelled, once the look under way returns) and runs the withdrawals
// already queued.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "asio/awaitable.hpp"
#include "dlasync/remote.hpp"

namespace dlasync {

struct remote_directory_options {
  // The Redis server: a numeric address or a host name, and its port.
  std::string address = "127.0.0.1";
  std::uint16_t port = 6379;
  // Every name is stored under this prefix: directories that share a
  // server keep apart by it.
  std::string prefix = "dlasync:";
  // How long one command to Redis may take (connecting included).
  std::chrono::milliseconds io_timeout{2000};
  // How often a wait looks again without a cue. A wait subscribes to the
  // name's channel, on which every directory's put and withdrawal publish,
  // so it wakes when the name changes; this bounds how late it sees a name
  // that a writer who does not publish changed. Above 0.
  std::chrono::milliseconds recheck{500};
};

// What a name holds: one tensor's descriptor, or a bundle.
using remote_entry = std::variant<remote_descriptor, remote_bundle>;

class remote_directory {
 public:
  // The longest entry `find` reads: a bundle of remote_bundle::max_members
  // members of max_ndim dimensions fits.
  static constexpr std::size_t max_entry_bytes = std::size_t{16} << 20;
  // The longest name.
  static constexpr std::size_t max_name_bytes = 512;
  // The most waits (wait_for, wait_withdrawn, import_remote_named) under
  // way at once on one directory; one more is refused with
  // ResourceExhausted.
  static constexpr std::size_t max_waits = 1024;

  // Connects to the server. InvalidArgument for an empty address, or an
  // io_timeout or recheck not above 0; Unavailable when the server cannot be reached
  // (its address, and what failed, in the message).
  static absl::StatusOr<std::unique_ptr<remote_directory>> connect(
      remote_directory_options options = {});

  remote_directory(const remote_directory&) = delete;
  remote_directory& operator=(const remote_directory&) = delete;
  ~remote_directory();

  // Puts an entry under `name` for `ttl` (the publication's lease): the name
  // goes when the ttl does, or when it is withdrawn. AlreadyExists when the
  // name is taken; InvalidArgument for an empty or too long name, or a ttl
  // not above 0; Unavailable when the server is not reachable.
  absl::Status put(std::string_view name, const remote_descriptor& descriptor,
                   std::chrono::milliseconds ttl);
  absl::Status put(std::string_view name, const remote_bundle& bundle,
                   std::chrono::milliseconds ttl);

  // What `name` holds now. NotFound when it holds nothing (never put,
  // withdrawn, or its ttl ended); DataLoss when the store holds something
  // that is no entry's string; OutOfRange above max_entry_bytes;
  // InvalidArgument or OutOfRange as decode refuses the bytes.
  absl::StatusOr<remote_entry> find(std::string_view name);

  // find, until the name holds an entry or `wait` has passed:
  // DeadlineExceeded then. It looks again when a put or a withdrawal is
  // published on the name's channel (the directory's subscription to it,
  // made when a first look finds nothing, and made again when its
  // connection breaks), and every options().recheck (at most a day); where
  // no subscription can be had, every 1 ms at first and every 50 ms at
  // most.
  // ResourceExhausted when max_waits wait already.
  absl::StatusOr<remote_entry> wait_for(std::string_view name, std::chrono::milliseconds wait);

  // Until `name` holds nothing: withdrawn (seen when it is published, as
  // wait_for sees puts) or its ttl ended (seen when the ttl the server
  // reports runs out). OK then, DeadlineExceeded after `wait`.
  absl::Status wait_withdrawn(std::string_view name, std::chrono::milliseconds wait);

  // put, and the name is withdrawn as soon as the publication it names
  // ends on `node` (remote_node::when_ended: its importers released it, its
  // lease ended, or the node shut down), not only when the ttl does. The
  // withdrawal runs on the directory's own thread and removes the name only
  // while it holds this entry, so a name put again since by another
  // exporter stays. A withdrawal that cannot reach the server, or comes
  // after the directory is destroyed, is skipped: the ttl still ends the
  // name. put's errors; InvalidArgument when the entry's exporter is not
  // `node` (its address and port); NotFound when the publication ended
  // before it was named (the name is withdrawn again then).
  absl::Status put_while_published(remote_node& node, std::string_view name,
                                   const remote_descriptor& descriptor,
                                   std::chrono::milliseconds ttl);
  absl::Status put_while_published(remote_node& node, std::string_view name,
                                   const remote_bundle& bundle, std::chrono::milliseconds ttl);

  // Removes `name`: NotFound when it held nothing.
  absl::Status withdraw(std::string_view name);
  // Removes `name` only while it holds this entry, in one step on the
  // server: FailedPrecondition when it holds another (put there since, by
  // another exporter), NotFound when it holds nothing.
  absl::Status withdraw(std::string_view name, const remote_descriptor& descriptor);
  absl::Status withdraw(std::string_view name, const remote_bundle& bundle);

  const remote_directory_options& options() const noexcept;

  // Internal: what the awaitable import waits with.
  class impl;
  std::shared_ptr<impl> get_impl() const noexcept { return impl_; }

 private:
  explicit remote_directory(std::shared_ptr<impl> impl) noexcept;
  // Shared with the withdrawals put_while_published leaves behind, which
  // hold it weakly.
  std::shared_ptr<impl> impl_;
};

#if defined(ASIO_HAS_CO_AWAIT)
// Waits up to `wait` for `name` in `directory` (as wait_for, on the
// directory's thread: several such waits go on together, and none blocks
// the runtime), then imports what it holds: a descriptor's tensor (one
// tensor in the vector) or a bundle's, as import_remote and
// import_remote_bundle do. The directory's errors (DeadlineExceeded,
// DataLoss, Unavailable, the decode's) come as they are, ResourceExhausted
// when max_waits wait already, and Cancelled when the coroutine is
// cancelled while it waits (terminal or partial cancellation, as far as
// the coroutine's cancellation state lets it through: terminal only, by
// default) or the directory is destroyed first; the import's as the import
// gives them. The directory is read when the call is made; the node when
// the coroutine runs.
[[nodiscard]] asio::awaitable<absl::StatusOr<std::vector<tensor>>> import_remote_named(
    remote_node& node, remote_directory& directory, std::string name,
    std::chrono::milliseconds wait, remote_import_options options = {});
#endif

}  // namespace dlasync
