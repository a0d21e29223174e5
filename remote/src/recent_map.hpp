// `recent_map` (internal): a map by string that keeps at most `capacity`
// entries and, when full, lets the least recently used go. The endpoint's
// cache of unpacked remote keys: a ring of pooled blocks keeps its keys
// however many others pass through once.
//
// Thread safety: none; the endpoint's lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>

namespace dlasync::remote_detail {

template <typename V>
class recent_map {
 public:
  explicit recent_map(std::size_t capacity) noexcept : capacity_(capacity) {}

  // The value under `key`, marked as used now; nullptr when absent.
  V* find(const std::string& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    it->second.used = ++uses_;
    return &it->second.value;
  }

  // Puts `value` under `key` (absent), first letting the least recently
  // used entry go when the map is full. Eviction scans the entries: the
  // capacity is small.
  V& put(const std::string& key, V value) {
    if (entries_.size() >= capacity_ && !entries_.empty()) {
      auto oldest = entries_.begin();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->second.used < oldest->second.used) oldest = it;
      }
      entries_.erase(oldest);
    }
    entry& e = entries_.insert_or_assign(key, entry{std::move(value), ++uses_}).first->second;
    return e.value;
  }

  std::size_t size() const noexcept { return entries_.size(); }
  void clear() noexcept { entries_.clear(); }

 private:
  struct entry {
    V value;
    std::uint64_t used;
  };
  std::size_t capacity_;
  std::uint64_t uses_ = 0;
  std::unordered_map<std::string, entry> entries_;
};

}  // namespace dlasync::remote_detail
