#include "session_set.hpp"

#include "asio/post.hpp"

namespace dlasync::examples {

std::uint64_t session_set::track(const std::shared_ptr<asio::ip::tcp::socket>& s) {
  std::lock_guard lock(mutex_);
  sessions_.emplace(++next_, s);
  return next_;
}

void session_set::untrack(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  sessions_.erase(id);
  if (sessions_.empty()) done_.notify_all();
}

void session_set::close_all() {
  std::unique_lock lock(mutex_);
  for (auto& [id, weak] : sessions_) {
    if (auto s = weak.lock()) {
      asio::post(s->get_executor(), [s] {
        asio::error_code ignored;
        s->shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
        s->close(ignored);
      });
    }
  }
  done_.wait(lock, [&] { return sessions_.empty(); });
}

}  // namespace dlasync::examples
