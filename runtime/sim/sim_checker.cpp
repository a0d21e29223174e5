#include "runtime/sim/sim_checker.hpp"

#include <algorithm>
#include <atomic>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace dlasync::cuda {
namespace {

const char* verb(access_kind k) {
  switch (k) {
    case access_kind::read: return "reads";
    case access_kind::write: return "writes";
    case access_kind::allocate: return "allocates";
    case access_kind::free: return "frees";
  }
  return "touches";
}

const char* verb(host_use u) {
  switch (u) {
    case host_use::read: return "reads";
    case host_use::write: return "writes";
    case host_use::release: return "releases";
  }
  return "touches";
}

std::string range(std::uintptr_t begin, std::uint64_t bytes) {
  return absl::StrCat("[", absl::Hex(begin), ", +", bytes, ")");
}

std::string site(const op_label& label) {
  return label.where.empty() ? std::string() : absl::StrCat(" (issued at ", label.where, ")");
}

struct registry {
  std::mutex mutex;
  std::vector<std::string> unclaimed;
  std::atomic<std::uint64_t> count{0};
};

registry& reports() {
  static registry* r = new registry;  // outlives every simulation, never destroyed
  return *r;
}

}  // namespace

void order_checker::join(clock& into, const clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (std::size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}

std::uint32_t order_checker::add_stream(std::string name) {
  std::lock_guard lock(mutex_);
  const auto id = static_cast<std::uint32_t>(streams_.size());
  names_.push_back(std::move(name));
  streams_.emplace_back(id + 1, 0);
  return id;
}

std::string order_checker::describe(const record& r) const {
  return absl::StrCat(r.label->call, " on ", names_[r.stream], site(*r.label));
}

std::vector<std::string> order_checker::enqueue(std::uint32_t stream,
                                                std::span<const access> accesses,
                                                const op_label& label) {
  std::lock_guard lock(mutex_);
  clock& now = streams_[stream];
  join(now, host_);
  const std::uint64_t tick = ++now[stream];
  std::vector<std::string> found;
  if (accesses.empty()) return found;
  auto shared = std::make_shared<const op_label>(label);
  const std::string self = absl::StrCat(label.call, " on ", names_[stream], site(label));
  for (const access& a : accesses) {
    if (a.bytes == 0) continue;
    const std::uintptr_t end = a.begin + a.bytes;
    auto bucket = records_.find(a.allocation);
    if (bucket == records_.end()) continue;
    for (const record& r : bucket->second) {
      if (r.end <= a.begin || r.begin >= end) continue;
      if (r.stream == stream) continue;  // one stream runs in order
      if (now.size() > r.stream && now[r.stream] >= r.tick) continue;
      if (r.kind == access_kind::read && a.kind == access_kind::read) continue;
      found.push_back(absl::StrCat(
          "race: ", self, " ", verb(a.kind), " ", range(a.begin, a.bytes), " while ", describe(r),
          " ", verb(r.kind), " ", range(r.begin, r.end - r.begin),
          ", and no event wait or host synchronization orders the one after the other"));
    }
  }
  for (const access& a : accesses) {
    if (a.bytes == 0) continue;
    const std::uintptr_t end = a.begin + a.bytes;
    std::vector<record>& bucket = records_[a.allocation];
    if (a.kind == access_kind::free) {
      // Everything before the free is ordered before it or reported; later
      // uses are the simulation's to refuse (the memory is gone).
      count_ -=
          std::erase_if(bucket, [&](const record& r) { return r.end > a.begin && r.begin < end; });
      continue;
    }
    bucket.push_back({a.begin, end, a.kind, stream, tick, shared});
    ++count_;
  }
  if (count_ >= prune_at_) {
    prune();
    prune_at_ = std::max<std::size_t>(256, count_ * 2);
  }
  return found;
}

order_checker::clock order_checker::capture(std::uint32_t stream) {
  std::lock_guard lock(mutex_);
  join(streams_[stream], host_);
  return streams_[stream];
}

void order_checker::wait(std::uint32_t stream, const clock& captured) {
  std::lock_guard lock(mutex_);
  join(streams_[stream], captured);
}

void order_checker::wait_for_stream(std::uint32_t stream, std::uint32_t other) {
  std::lock_guard lock(mutex_);
  const clock theirs = streams_[other];
  join(streams_[stream], theirs);
}

void order_checker::host_learns(const clock& captured) {
  std::lock_guard lock(mutex_);
  join(host_, captured);
}

void order_checker::host_learns_everything() {
  std::lock_guard lock(mutex_);
  for (const clock& c : streams_) join(host_, c);
  prune();
}

std::vector<std::string> order_checker::host_access(std::uintptr_t allocation, std::uintptr_t begin,
                                                    std::uint64_t bytes, host_use use,
                                                    const op_label& label) {
  std::lock_guard lock(mutex_);
  std::vector<std::string> found;
  auto bucket = records_.find(allocation);
  if (bytes == 0 || bucket == records_.end()) return found;
  const std::uintptr_t end = begin + bytes;
  auto mine = [&](const record& r) {
    return r.end > begin && r.begin < end && (label.owner == 0 || r.label->owner == label.owner);
  };
  for (const record& r : bucket->second) {
    if (!mine(r) || host_knows(r)) continue;
    if (use == host_use::read && r.kind == access_kind::read) continue;
    found.push_back(absl::StrCat("race: the host ", verb(use), " ", range(begin, bytes), " (",
                                 label.call, site(label), ") while ", describe(r), " ",
                                 verb(r.kind), " ", range(r.begin, r.end - r.begin),
                                 ", which the host has not seen complete (no event query, "
                                 "synchronization or drain covers it)"));
  }
  if (use == host_use::release) count_ -= std::erase_if(bucket->second, mine);
  return found;
}

void order_checker::forget(std::uintptr_t allocation) {
  std::lock_guard lock(mutex_);
  auto bucket = records_.find(allocation);
  if (bucket == records_.end()) return;
  count_ -= bucket->second.size();
  records_.erase(bucket);
}

std::size_t order_checker::records() const {
  std::lock_guard lock(mutex_);
  return count_;
}

void order_checker::prune() {
  for (auto it = records_.begin(); it != records_.end();) {
    count_ -= std::erase_if(it->second, [this](const record& r) { return host_knows(r); });
    it = it->second.empty() ? records_.erase(it) : std::next(it);
  }
}

std::vector<std::string> take_sim_reports() {
  registry& r = reports();
  std::lock_guard lock(r.mutex);
  return std::exchange(r.unclaimed, {});
}

std::uint64_t sim_report_count() {
  return reports().count.load();
}

void add_sim_report(std::string report) {
  registry& r = reports();
  std::lock_guard lock(r.mutex);
  r.unclaimed.push_back(std::move(report));
  r.count.fetch_add(1);
}

}  // namespace dlasync::cuda
