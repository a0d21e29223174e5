// Peers of the server's UCX transport that misbehave on purpose, for
// dlasync_load (the UCX counterpart of slow_peer.hpp). Each drives one
// process's worth of misbehaviour through a `ucx_client` and checks what the
// server did about it:
//
//   - stall: a request whose body comes by rendezvous on each of N
//     connections, and then no UCX progress at all (the body is never
//     served) until a file appears; the server must answer DeadlineExceeded
//     or close the connection, not wait;
//   - flood: N requests sent back to back on one connection, none waited
//     for, while the server's budget is held; the server must queue a few
//     and refuse the rest at once with ResourceExhausted;
//   - garbage: N messages that break the protocol (headers of another size,
//     a wrong magic or reserved word, no reply flag, requests cut short, data
//     that is no request, eager and by rendezvous), then a valid request,
//     which must be answered.
//
// Each prints what it saw, as lines the tests read, and returns its
// problems (empty when the server did what it must).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ucx_client.hpp"

namespace dlasync::examples {

struct ucx_peer_target {
  std::string host;
  int port = 0;
};

struct ucx_stall_options {
  int connections = 4;
  std::uint32_t body_bytes = 1 << 20;
  // No progress until this file exists, or `longest` has passed.
  std::filesystem::path until_file;
  std::chrono::milliseconds longest{30000};
};
std::vector<std::string> run_ucx_stall(ucx_client& client, const ucx_peer_target& server,
                                       const ucx_stall_options& options);

struct ucx_flood_options {
  int requests = 20000;
  std::uint32_t body_bytes = 6 << 10;
  // Requests the server queues (its --max_queued_requests): the flood says
  // when all but these are answered.
  int server_queued = 16;
  // How long one answer may take to come (a hang guard).
  std::chrono::milliseconds answer_within{30000};
};
std::vector<std::string> run_ucx_flood(ucx_client& client, const ucx_peer_target& server,
                                       const ucx_flood_options& options);

struct ucx_garbage_options {
  int messages = 2000;
  std::uint32_t seed = 1;
};
std::vector<std::string> run_ucx_garbage(ucx_client& client, const ucx_peer_target& server,
                                         const ucx_garbage_options& options);

// Whether dlasync_load's command line asks for one of these peers
// (--ucx_stall, --ucx_flood, --ucx_garbage); run_ucx_hostile runs it, with
// the options the flags give.
bool ucx_hostile_requested();
std::vector<std::string> run_ucx_hostile(ucx_client& client, const ucx_peer_target& server);

}  // namespace dlasync::examples
