// `import_remote_named` (dlasync/remote_directory.hpp): a wait on the
// directory's loop (directory_waits.hpp), started and cancelled as every
// dlasync operation is (dlasync/detail/import_initiation.hpp's launch), then
// the import of what the name holds.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "asio/async_result.hpp"
#include "asio/use_awaitable.hpp"
#include "dlasync/detail/import_initiation.hpp"
#include "dlasync/remote_directory.hpp"
#include "remote/src/directory_impl.hpp"

namespace dlasync {

#if defined(ASIO_HAS_CO_AWAIT)
namespace {

// One named import's wait, as detail::launch starts it and cancels it
// (through the handler's cancellation slot).
struct named_wait {
  std::weak_ptr<remote_directory::impl> directory;
  std::string name;
  std::chrono::milliseconds wait;
  std::mutex mutex;
  std::uint64_t id = 0;    // guarded by mutex
  bool cancelled = false;  // guarded by mutex
};

void start(const std::shared_ptr<named_wait>& op, remote_detail::entry_fn done) {
  std::shared_ptr<remote_directory::impl> d = op->directory.lock();
  if (d == nullptr) {
    std::move(done)(absl::CancelledError("the directory was destroyed before the wait began"));
    return;
  }
  const std::uint64_t id = remote_detail::await_entry(*d, op->name, op->wait, std::move(done));
  std::lock_guard lock(op->mutex);
  op->id = id;
  if (op->cancelled) d->waits.cancel(id);
}

void cancel(named_wait& op) {
  std::lock_guard lock(op.mutex);
  op.cancelled = true;
  if (op.id == 0) return;  // start cancels it
  if (std::shared_ptr<remote_directory::impl> d = op.directory.lock()) d->waits.cancel(op.id);
}

}  // namespace

namespace {

// import_remote_named once its wait is made: the wait is the directory's
// loop's, never a thread of the runtime's; its result comes back on the
// coroutine's executor, and the coroutine's cancellation ends it.
asio::awaitable<absl::StatusOr<std::vector<tensor>>> import_named(remote_node& node,
                                                                  std::shared_ptr<named_wait> op,
                                                                  remote_import_options options) {
  absl::StatusOr<remote_entry> entry =
      co_await asio::async_initiate<const asio::use_awaitable_t<>&,
                                    void(absl::StatusOr<remote_entry>)>(
          [&node, &op](auto handler) {
            detail::launch<absl::StatusOr<remote_entry>>(std::move(handler), node.get_runtime(),
                                                         op);
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

}  // namespace

asio::awaitable<absl::StatusOr<std::vector<tensor>>> import_remote_named(
    remote_node& node, remote_directory& directory, std::string name,
    std::chrono::milliseconds wait, remote_import_options options) {
  // Not a coroutine: the directory is read now, when the call is made, so a
  // directory destroyed before the coroutine first runs ends its wait with
  // Cancelled rather than being read after it is gone.
  auto op = std::make_shared<named_wait>();
  op->directory = directory.get_impl();
  op->name = std::move(name);
  op->wait = wait;
  return import_named(node, std::move(op), options);
}
#endif

}  // namespace dlasync
