// dlasync/remote_registration.hpp
//
// A region of memory a remote node keeps registered for RMA
// (remote_node::register_memory in dlasync/remote.hpp).
#pragma once

#include <cstdint>
#include <memory>

namespace dlasync {

namespace detail {
class remote_core;
}  // namespace detail

// `dlasync::remote_registration` keeps a region of this process's memory
// registered with UCX for RMA by a node that trusts its peers
// (remote_node::register_memory): every tensor published inside it, alone
// or in a bundle, is read under the registration's key, and no publication
// registers anything of its own. Register a pool or a ring once, and
// re-publishing its buffers costs no registration (NIXL's model: the
// caller says how long the memory stays, so no registration outlives it
// unseen). Publications made under it keep it until they end, even when
// the handle goes first; the memory must stay mapped until then.
//
// Example:
//
//   auto pool = std::make_unique<std::byte[]>(64 << 20);
//   absl::StatusOr<dlasync::remote_registration> reg =
//       node.register_memory(pool.get(), 64 << 20);
//   ... publish tensors that lie in the pool, as often as needed ...
//   reg->reset();  // or let it go out of scope
//
// Thread safety: a handle is one owner's (move-only); reset (and the
// destructor) may run on any thread, and takes the node's lock briefly.
class remote_registration {
 public:
  remote_registration() noexcept = default;
  remote_registration(remote_registration&& other) noexcept;
  remote_registration& operator=(remote_registration&& other) noexcept;
  remote_registration(const remote_registration&) = delete;
  remote_registration& operator=(const remote_registration&) = delete;
  // reset().
  ~remote_registration();

  // Lets the registration go: unregistered now, or when the last
  // publication under it ends. Does nothing on an empty handle or after
  // the node shut down (which unregistered everything).
  void reset() noexcept;
  // Whether this handle holds a registration.
  bool registered() const noexcept { return id_ != 0; }
  // The registered region, [address, address + bytes).
  std::uint64_t address() const noexcept { return address_; }
  std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  friend class remote_node;
  remote_registration(std::weak_ptr<detail::remote_core> core, std::uint64_t id,
                      std::uint64_t address, std::uint64_t bytes) noexcept;

  std::weak_ptr<detail::remote_core> core_;
  std::uint64_t id_ = 0;
  std::uint64_t address_ = 0;
  std::uint64_t bytes_ = 0;
};

}  // namespace dlasync
