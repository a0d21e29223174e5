// The connections a front serves, so that it can close them all at once
// when the server stops, and wait until each has ended.
//
//   const std::uint64_t id = sessions.track(socket);  // as it starts
//   ...
//   sessions.untrack(id);                              // as it ends
//   sessions.close_all();                              // at stop
//
// Thread safety: all members are safe from any thread; close_all() waits,
// so not from the executor's threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "asio/ip/tcp.hpp"

namespace dlasync::examples {

class session_set {
 public:
  std::uint64_t track(const std::shared_ptr<asio::ip::tcp::socket>& s);
  void untrack(std::uint64_t id);
  // Closes every connection (on its own executor) and waits until all ended.
  void close_all();

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::map<std::uint64_t, std::weak_ptr<asio::ip::tcp::socket>> sessions_;
  std::uint64_t next_ = 0;
};

}  // namespace dlasync::examples
