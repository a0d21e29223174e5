// Slow peers for dlasync_load: HTTP connections that announce a request body
// (an infer request's Content-Length) and then send it a byte at a time, as a
// client on a bad link, or one that means harm, would. The server must cut
// them off at its read deadline and go on answering everyone else.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "asio/awaitable.hpp"
#include "asio/ip/tcp.hpp"

namespace dlasync::examples {

struct slow_peer_options {
  std::uint32_t announced_bytes = 1 << 20;  // the body length the header announces, >= 1
  std::chrono::milliseconds interval{100};  // between two bytes of the body
  std::chrono::milliseconds give_up_after{10000};
  std::string host = "127.0.0.1";  // the Host header
};

// What the slow peers saw. Thread safety: shared by all of them.
struct slow_peer_stats {
  std::atomic<int> started{0};  // sent their header and the body's first byte
  std::atomic<int> disconnected{0};
  std::atomic<int> told_deadline{0};  // read a 408 (Request Timeout) before the end
  std::mutex mutex;
  std::vector<double> disconnected_after_ms;  // from the body's first byte
  std::vector<std::string> problems;
};

// Connects to `server`, sends a request's head and the body's first byte,
// then one byte every `interval`, until the server disconnects. Sending the
// whole body, or still being connected after `give_up_after`, is a problem.
// Reads and writes the socket at once: spawn it on a strand.
asio::awaitable<void> slow_peer(asio::ip::tcp::endpoint server, slow_peer_options options,
                                slow_peer_stats& stats);

}  // namespace dlasync::examples
