// How many connections a server holds at once, over all its transports.
//
// Every connection costs the server descriptors (a TCP socket; a UCX
// endpoint's sockets) and memory. `connection_limit` hands out a `slot` per
// connection and refuses (and counts) connections past its maximum, so that
// the server runs out of connections it may take before it runs out of
// descriptors: a server out of descriptors cannot even accept a connection to
// refuse it. `default_max_connections` derives the maximum from the
// descriptors this process may still open (RLIMIT_NOFILE).
//
//   auto limit = connection_limit::create(default_max_connections());
//   if (std::optional<connection_limit::slot> s = limit->try_take()) {
//     serve(std::move(socket), std::move(*s));  // the slot goes when the connection ends
//   } else {
//     refuse(socket);  // counted in limit->refused()
//   }
//
// Thread safety: all members are safe to call from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

namespace dlasync::examples {

class connection_limit : public std::enable_shared_from_this<connection_limit> {
 public:
  // One connection's place: given back when the slot is destroyed. Move-only.
  class slot {
   public:
    slot(slot&& other) noexcept = default;
    slot& operator=(slot&& other) noexcept;
    slot(const slot&) = delete;
    slot& operator=(const slot&) = delete;
    ~slot();

   private:
    friend class connection_limit;
    explicit slot(std::shared_ptr<connection_limit> owner) : owner_(std::move(owner)) {}
    std::shared_ptr<connection_limit> owner_;
  };

  // At most `max` connections at once (at least 1).
  static std::shared_ptr<connection_limit> create(std::size_t max);

  // A slot for one more connection; nullopt, counted as a refusal, when
  // `max()` connections hold one already.
  std::optional<slot> try_take();

  std::size_t max() const noexcept { return max_; }
  std::size_t in_use() const noexcept { return in_use_.load(); }
  std::uint64_t refused() const noexcept { return refused_.load(); }
  // The most connections held at once so far.
  std::size_t peak() const noexcept { return peak_.load(); }

 private:
  explicit connection_limit(std::size_t max) : max_(max) {}
  void give_back() noexcept;

  const std::size_t max_;
  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> peak_{0};
  std::atomic<std::uint64_t> refused_{0};
};

// Three quarters of the descriptors this process may still open: its soft
// RLIMIT_NOFILE less the descriptors open now (call it once the server's own
// listeners and runtime exist); at least 1. The rest stays for what a
// connection costs besides its socket (UCX opens several per endpoint) and
// for the server itself.
std::size_t default_max_connections();

}  // namespace dlasync::examples
