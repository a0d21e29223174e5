// The memory a trusted node has registered with UCX for RMA (internal):
// the regions users keep registered (remote_node::register_memory), and
// those a publication registers for itself and lets go when it ends.
//
// A publication's region is read under the key of a user's registration
// that covers it, with no new registration; the rest of a publication's
// regions are merged where they overlap or touch and registered once each.
// Every entry counts the publications that use it, and is unregistered when
// neither they nor a user hold it any more. All members require the node's
// lock; clear_locked() runs before the UCX context is cleaned up.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/status/statusor.h"

namespace dlasync::detail {

class registration_table {
 public:
  explicit registration_table(ucp_context_h context) noexcept : context_(context) {}
  registration_table(const registration_table&) = delete;
  registration_table& operator=(const registration_table&) = delete;
  ~registration_table() = default;  // clear_locked() ran

  // A user's registration of [begin, begin + bytes): its id. AlreadyExists
  // when it overlaps another user's registration, Internal when UCX refuses.
  absl::StatusOr<std::uint64_t> add_user_locked(std::uint64_t begin, std::uint64_t bytes);
  // The user lets it go: unregistered now, or when the last publication
  // that uses it ends. Unknown ids (cleared at shutdown) are ignored.
  void remove_user_locked(std::uint64_t id);

  // One region of a publication; `key` is set to the packed key it is read
  // under (empty for a region of 0 bytes).
  struct region {
    std::uint64_t begin = 0;
    std::uint64_t bytes = 0;
    std::string key;
  };
  // Keys for every region, each entry used counted once: the ids to
  // release when the publication ends. Internal (nothing kept) when UCX
  // refuses a registration.
  absl::StatusOr<std::vector<std::uint64_t>> cover_locked(std::vector<region>& regions);
  void release_locked(const std::vector<std::uint64_t>& ids);

  // Unregisters everything (the node shuts down, and registers nothing
  // after it); ids handed out before find nothing.
  void clear_locked();
  // Registrations held now (users' and publications'), and UCX
  // registrations made since the node started.
  std::size_t size_locked() const noexcept { return entries_.size(); }
  std::uint64_t made_locked() const noexcept { return made_; }

 private:
  struct entry {
    std::uint64_t begin = 0;
    std::uint64_t bytes = 0;
    ucp_mem_h memh = nullptr;
    std::string key;
    std::uint64_t uses = 0;  // publications
    bool user = false;
  };
  // A new entry for [begin, begin + bytes), used once.
  absl::StatusOr<std::uint64_t> register_locked(std::uint64_t begin, std::uint64_t bytes,
                                                bool user);
  void drop_if_unused_locked(std::map<std::uint64_t, entry>::iterator it);

  ucp_context_h context_;
  std::uint64_t last_id_ = 0;
  std::uint64_t made_ = 0;
  std::map<std::uint64_t, entry> entries_;  // by id
  // Users' registrations by their first byte: they do not overlap.
  std::map<std::uint64_t, std::uint64_t> users_;
};

}  // namespace dlasync::detail
