#include "connection_limit.hpp"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>

namespace dlasync::examples {

connection_limit::slot& connection_limit::slot::operator=(slot&& other) noexcept {
  if (this != &other) {
    if (owner_ != nullptr) owner_->give_back();
    owner_ = std::move(other.owner_);
  }
  return *this;
}

connection_limit::slot::~slot() {
  if (owner_ != nullptr) owner_->give_back();
}

std::shared_ptr<connection_limit> connection_limit::create(std::size_t max) {
  return std::shared_ptr<connection_limit>(new connection_limit(std::max<std::size_t>(1, max)));
}

std::optional<connection_limit::slot> connection_limit::try_take() {
  std::size_t held = in_use_.load();
  do {
    if (held >= max_) {
      refused_.fetch_add(1);
      return std::nullopt;
    }
  } while (!in_use_.compare_exchange_weak(held, held + 1));
  std::size_t peak = peak_.load();
  while (held + 1 > peak && !peak_.compare_exchange_weak(peak, held + 1)) {
  }
  return slot(shared_from_this());
}

void connection_limit::give_back() noexcept {
  in_use_.fetch_sub(1);
}

namespace {

// Descriptors this process has open now (the entries of /proc/self/fd, less
// the one that lists them); 0 where that cannot be read.
std::size_t descriptors_open() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  std::size_t n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n > 0 ? n - 1 : 0;
}

}  // namespace

std::size_t default_max_connections() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return 1 << 16;
  }
  const auto soft = static_cast<std::size_t>(limit.rlim_cur);
  const std::size_t open = descriptors_open();
  const std::size_t free = soft > open ? soft - open : 0;
  return std::max<std::size_t>(1, free / 4 * 3);
}

}  // namespace dlasync::examples
