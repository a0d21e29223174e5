#include "remote/src/registrations.hpp"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "remote/src/ucx_error.hpp"

namespace dlasync::detail {

absl::StatusOr<std::uint64_t> registration_table::register_locked(std::uint64_t begin,
                                                                  std::uint64_t bytes, bool user) {
  entry e;
  e.begin = begin;
  e.bytes = bytes;
  e.user = user;
  e.uses = user ? 0 : 1;
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  // NOLINTNEXTLINE(performance-no-int-to-ptr): memory of this process
  p.address = reinterpret_cast<void*>(static_cast<std::uintptr_t>(begin));
  p.length = bytes;
  if (ucs_status_t s = ucp_mem_map(context_, &p, &e.memh); s != UCS_OK) {
    return remote_detail::ucx_error(
        s, absl::StrCat("UCX could not register ", bytes, " bytes at 0x", absl::Hex(begin)));
  }
  void* packed = nullptr;
  std::size_t packed_size = 0;
  if (ucs_status_t s = ucp_rkey_pack(context_, e.memh, &packed, &packed_size); s != UCS_OK) {
    ucp_mem_unmap(context_, e.memh);
    return remote_detail::ucx_error(s, "UCX could not pack the remote key");
  }
  e.key.assign(static_cast<const char*>(packed), packed_size);
  ucp_rkey_buffer_release(packed);
  ++made_;
  const std::uint64_t id = ++last_id_;
  entries_.emplace(id, std::move(e));
  return id;
}

absl::StatusOr<std::uint64_t> registration_table::add_user_locked(std::uint64_t begin,
                                                                  std::uint64_t bytes) {
  // The first registration past `begin`, and the one before it: the only
  // ones that could overlap.
  auto next = users_.lower_bound(begin);
  auto overlap = [&](std::map<std::uint64_t, std::uint64_t>::iterator u) -> const entry* {
    const entry& e = entries_.at(u->second);
    return e.begin < begin + bytes && begin < e.begin + e.bytes ? &e : nullptr;
  };
  const entry* clash = next != users_.end() ? overlap(next) : nullptr;
  if (clash == nullptr && next != users_.begin()) clash = overlap(std::prev(next));
  if (clash != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat(
        "register_memory: ", bytes, " bytes at 0x", absl::Hex(begin),
        " overlap the registration of ", clash->bytes, " bytes at 0x", absl::Hex(clash->begin),
        "; register each region once (a registration covers every tensor inside it)"));
  }
  absl::StatusOr<std::uint64_t> id = register_locked(begin, bytes, /*user=*/true);
  if (id.ok()) users_.emplace(begin, *id);
  return id;
}

void registration_table::remove_user_locked(std::uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.user) return;
  users_.erase(it->second.begin);
  it->second.user = false;
  drop_if_unused_locked(it);
}

absl::StatusOr<std::vector<std::uint64_t>> registration_table::cover_locked(
    std::vector<region>& regions) {
  std::vector<std::uint64_t> ids;
  auto use = [&](std::uint64_t id) {
    if (std::find(ids.begin(), ids.end(), id) != ids.end()) return;
    ++entries_.at(id).uses;
    ids.push_back(id);
  };
  // The regions no user's registration covers, by their first byte.
  std::vector<std::size_t> rest;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    region& r = regions[i];
    if (r.bytes == 0) continue;
    auto u = users_.upper_bound(r.begin);
    if (u != users_.begin()) {
      const std::uint64_t id = std::prev(u)->second;
      const entry& e = entries_.at(id);
      if (r.begin - e.begin <= e.bytes && r.bytes <= e.bytes - (r.begin - e.begin)) {
        r.key = e.key;
        use(id);
        continue;
      }
    }
    rest.push_back(i);
  }
  std::sort(rest.begin(), rest.end(),
            [&](std::size_t a, std::size_t b) { return regions[a].begin < regions[b].begin; });
  // Runs of regions that overlap or touch, registered as one.
  for (std::size_t first = 0; first < rest.size();) {
    const std::uint64_t begin = regions[rest[first]].begin;
    std::uint64_t end = begin + regions[rest[first]].bytes;
    std::size_t last = first + 1;
    while (last < rest.size() && regions[rest[last]].begin <= end) {
      end = std::max(end, regions[rest[last]].begin + regions[rest[last]].bytes);
      ++last;
    }
    absl::StatusOr<std::uint64_t> id = register_locked(begin, end - begin, /*user=*/false);
    if (!id.ok()) {
      release_locked(ids);
      return id.status();
    }
    ids.push_back(*id);
    for (std::size_t i = first; i < last; ++i) regions[rest[i]].key = entries_.at(*id).key;
    first = last;
  }
  return ids;
}

void registration_table::release_locked(const std::vector<std::uint64_t>& ids) {
  for (std::uint64_t id : ids) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;
    if (it->second.uses > 0) --it->second.uses;
    drop_if_unused_locked(it);
  }
}

void registration_table::drop_if_unused_locked(std::map<std::uint64_t, entry>::iterator it) {
  if (it->second.user || it->second.uses > 0) return;
  ucp_mem_unmap(context_, it->second.memh);
  entries_.erase(it);
}

void registration_table::clear_locked() {
  for (auto& [id, e] : entries_) ucp_mem_unmap(context_, e.memh);
  entries_.clear();
  users_.clear();
}

}  // namespace dlasync::detail
