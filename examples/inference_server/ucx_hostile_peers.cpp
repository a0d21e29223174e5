#include "ucx_hostile_peers.hpp"

#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "frame.hpp"
#include "ucx_front.hpp"

ABSL_FLAG(int, ucx_stall, 0,
          "A stalled UCX peer (--transport=ucx): on this many connections, a request of "
          "--stall_kib whose body goes by rendezvous, then no UCX progress until "
          "--stall_until_file exists; each must be answered DeadlineExceeded, or its connection "
          "closed, or (released before the server's deadline) answered OK.");
ABSL_FLAG(int, stall_kib, 1024, "The stalled requests' bodies, in KiB.");
ABSL_FLAG(std::string, stall_until_file, "",
          "The stalled peer makes progress again once this file exists (30 s at most).");
ABSL_FLAG(int, ucx_flood, 0,
          "A flooding UCX peer: this many requests of --flood_kib sent back to back on one "
          "connection; each must be answered OK or refused with ResourceExhausted naming the "
          "server's queue bound.");
ABSL_FLAG(int, flood_kib, 6, "The flood's request bodies, in KiB.");
ABSL_FLAG(int, server_max_queued_requests, 16,
          "The server's --max_queued_requests: the flood prints a line once all but these are "
          "answered.");
ABSL_FLAG(int, ucx_garbage, 0,
          "A UCX peer that sends this many protocol-breaking messages, then a valid request "
          "that must be answered OK.");

namespace dlasync::examples {
namespace {

using namespace std::chrono_literals;

// A valid request whose body is `body_bytes` long (at least 32): a vector
// of uint8 ones, so that its sum and count are `ones(body_bytes)`.
std::vector<std::byte> ones_request(std::uint64_t id, std::uint32_t body_bytes) {
  const std::vector<std::int64_t> shape{static_cast<std::int64_t>(body_bytes) - 32};
  const std::vector<std::int64_t> strides{1};
  const std::vector<std::byte> payload(body_bytes - 32, std::byte{1});
  return encode_request(id, dtypes::uint8, shape, strides, payload);
}

bool is_ones_answer(const response& r, std::uint32_t body_bytes) {
  return r.code == absl::StatusCode::kOk && r.count == static_cast<std::int64_t>(body_bytes) - 32 &&
         r.sum == static_cast<double>(body_bytes - 32);
}

std::string describe(const absl::StatusOr<response>& r) {
  if (!r.ok()) return r.status().ToString();
  return absl::StrCat(absl::StatusCodeToString(r->code), " (", r->text, ")");
}

// A new connection whose first request was answered: it is up. With
// `rendezvous`, that request's body went by rendezvous, so the connection is
// set up for it too (UCX sends a connection's first messages before all its
// lanes are up, eagerly whatever their size).
absl::StatusOr<int> connect_and_check(ucx_client& client, const ucx_peer_target& server,
                                      bool rendezvous = false) {
  absl::StatusOr<int> c = client.connect(server.host, server.port);
  if (!c.ok()) return c.status();
  constexpr std::uint32_t body_bytes = 64 << 10;
  const absl::Status sent = client.send(*c, ones_request(1, body_bytes), rendezvous);
  if (!sent.ok()) return sent;
  const absl::StatusOr<response> r = client.receive(*c, 10s);
  if (!r.ok() || !is_ones_answer(*r, body_bytes)) {
    return absl::UnavailableError(absl::StrCat("a first request was not answered: ", describe(r)));
  }
  return c;
}

void set_u32(std::vector<std::byte>& bytes, std::size_t at, std::uint32_t v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

}  // namespace

std::vector<std::string> run_ucx_stall(ucx_client& client, const ucx_peer_target& server,
                                       const ucx_stall_options& options) {
  std::vector<std::string> problems;
  std::vector<int> connections;
  for (int i = 0; i < options.connections; ++i) {
    // Set up for rendezvous: the stalled announcements go out at once.
    absl::StatusOr<int> c = connect_and_check(client, server, /*rendezvous=*/true);
    if (!c.ok()) return {absl::StrCat("stall: ", c.status().ToString())};
    connections.push_back(*c);
  }
  const absl::Status stalled = client.stall(connections, ones_request(2, options.body_bytes), [&] {
    std::printf("  stalling: %d requests of %u bytes sent; no progress until %s exists\n",
                options.connections, options.body_bytes, options.until_file.c_str());
    std::fflush(stdout);
    const auto give_up = std::chrono::steady_clock::now() + options.longest;
    while (!std::filesystem::exists(options.until_file) &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(20ms);
    }
  });
  if (!stalled.ok()) return {absl::StrCat("stall: ", stalled.ToString())};
  int answered = 0;
  int late = 0;
  int closed = 0;
  for (int c : connections) {
    const absl::StatusOr<response> r = client.receive(c, 10s);
    if (r.ok() && is_ones_answer(*r, options.body_bytes)) {
      ++answered;
    } else if (r.ok() && r->code == absl::StatusCode::kDeadlineExceeded &&
               r->text.find("--read_timeout_ms") != std::string::npos) {
      ++late;
    } else if (!r.ok() && r.status().code() == absl::StatusCode::kUnavailable) {
      ++closed;
    } else {
      problems.push_back(absl::StrCat("stalled request: ", describe(r)));
    }
  }
  std::printf(
      "  stalled requests: %d: %d answered OK, %d told DeadlineExceeded, %d disconnected "
      "without an answer\n",
      options.connections, answered, late, closed);
  return problems;
}

std::vector<std::string> run_ucx_flood(ucx_client& client, const ucx_peer_target& server,
                                       const ucx_flood_options& options) {
  // No first request to see the connection up: the budget is held, and it
  // would wait. UCX keeps the sends until the connection is up.
  absl::StatusOr<int> c = client.connect(server.host, server.port);
  if (!c.ok()) return {absl::StrCat("flood: ", c.status().ToString())};
  for (int i = 0; i < options.requests; ++i) {
    const absl::Status sent = client.send(*c, ones_request(100 + i, options.body_bytes));
    if (!sent.ok()) return {absl::StrCat("flood: request ", i, ": ", sent.ToString())};
  }
  std::vector<std::string> problems;
  int answered = 0;
  int refused = 0;
  bool said = false;
  for (int got = 0; got < options.requests; ++got) {
    if (!said && got >= options.requests - options.server_queued) {
      std::printf("  flood: all but %d answered (%d refused with ResourceExhausted)\n",
                  options.requests - got, refused);
      std::fflush(stdout);
      said = true;
    }
    const absl::StatusOr<response> r = client.receive(*c, options.answer_within);
    if (!r.ok()) {
      problems.push_back(absl::StrCat("flood: ", options.requests - got,
                                      " requests unanswered: ", r.status().ToString()));
      break;
    }
    if (is_ones_answer(*r, options.body_bytes)) {
      ++answered;
    } else if (r->code == absl::StatusCode::kResourceExhausted &&
               r->text.find("--max_queued_") != std::string::npos) {
      ++refused;
    } else if (problems.size() < 10) {
      problems.push_back(absl::StrCat("flood: request ", r->id, ": ", describe(*r)));
    }
  }
  std::printf("  flood: %d requests, %d refused with ResourceExhausted, %d answered OK\n",
              options.requests, refused, answered);
  return problems;
}

std::vector<std::string> run_ucx_garbage(ucx_client& client, const ucx_peer_target& server,
                                         const ucx_garbage_options& options) {
  absl::StatusOr<int> c = connect_and_check(client, server);
  if (!c.ok()) return {absl::StrCat("garbage: ", c.status().ToString())};
  std::printf("  garbage: connected, sending %d messages\n", options.messages);
  std::fflush(stdout);
  std::mt19937 rng(options.seed);
  auto below = [&](std::uint32_t n) { return static_cast<std::uint32_t>(rng() % n); };
  int expected = 0;  // messages with the reply flag: each gets one answer
  for (int i = 0; i < options.messages; ++i) {
    std::vector<std::byte> header(frame_header_bytes + 8 + below(56));
    for (std::byte& b : header) b = static_cast<std::byte>(rng());
    set_u32(header, 0, request_magic);
    std::size_t data = below(512);
    bool reply = true;
    // Rendezvous sizes (past UCX's eager limit) for a share of them.
    const std::size_t large = (64u << 10) + below(448u << 10);
    switch (below(7)) {
      case 0:  // shorter than a frame header
        header.resize(below(frame_header_bytes));
        break;
      case 1:  // no way to answer
        reply = false;
        set_u32(header, 4, static_cast<std::uint32_t>(header.size() - frame_header_bytes + data));
        break;
      case 2:  // a wrong magic, with a payload sent by rendezvous
        set_u32(header, 0, 0x50545448);
        data = large;
        break;
      case 3:  // a body length that disagrees with what the message carries
        data = below(2) == 0 ? data : large;
        set_u32(header, 4,
                static_cast<std::uint32_t>(header.size() - frame_header_bytes + data + 1 +
                                           below(1000)));
        break;
      case 4:  // any bytes at all
        set_u32(header, 0, static_cast<std::uint32_t>(rng()));
        set_u32(header, 4, static_cast<std::uint32_t>(rng()));
        break;
      case 5:  // a body over any frame limit
        set_u32(header, 4, 0xFFFFFFFFu);
        break;
      default:  // a frame whose length holds, but whose body is garbage
        data = below(2) == 0 ? data : large;
        set_u32(header, 4, static_cast<std::uint32_t>(header.size() - frame_header_bytes + data));
        break;
    }
    const absl::Status sent =
        client.send_raw(*c, ucx_request_am, reply, header, data, static_cast<std::byte>(rng()));
    if (!sent.ok()) return {absl::StrCat("garbage: message ", i, ": ", sent.ToString())};
    expected += reply ? 1 : 0;
  }
  constexpr std::uint64_t last_id = 7777;
  if (absl::Status sent = client.send(*c, ones_request(last_id, 256)); !sent.ok()) {
    return {absl::StrCat("garbage: the valid request after it: ", sent.ToString())};
  }
  ++expected;
  std::vector<std::string> problems;
  bool last_ok = false;
  int answers = 0;
  for (; answers < expected; ++answers) {
    const absl::StatusOr<response> r = client.receive(*c, 30s);
    if (!r.ok()) {
      problems.push_back(absl::StrCat("garbage: ", expected - answers,
                                      " messages unanswered: ", r.status().ToString()));
      break;
    }
    if (r->id == last_id) last_ok = is_ones_answer(*r, 256);
  }
  if (!last_ok) problems.emplace_back("garbage: the valid request after it was not answered OK");
  std::printf(
      "  garbage: %d messages sent, %d answers for the %d that asked for one; the valid "
      "request after them %s\n",
      options.messages, answers, expected, last_ok ? "answered OK" : "NOT answered OK");
  return problems;
}

bool ucx_hostile_requested() {
  return absl::GetFlag(FLAGS_ucx_stall) > 0 || absl::GetFlag(FLAGS_ucx_flood) > 0 ||
         absl::GetFlag(FLAGS_ucx_garbage) > 0;
}

std::vector<std::string> run_ucx_hostile(ucx_client& client, const ucx_peer_target& server) {
  std::vector<std::string> problems;
  auto add = [&](std::vector<std::string> more) {
    problems.insert(problems.end(), more.begin(), more.end());
  };
  if (absl::GetFlag(FLAGS_ucx_garbage) > 0) {
    ucx_garbage_options o;
    o.messages = absl::GetFlag(FLAGS_ucx_garbage);
    add(run_ucx_garbage(client, server, o));
  }
  if (absl::GetFlag(FLAGS_ucx_flood) > 0) {
    ucx_flood_options o;
    o.requests = absl::GetFlag(FLAGS_ucx_flood);
    o.body_bytes = static_cast<std::uint32_t>(std::max(1, absl::GetFlag(FLAGS_flood_kib))) << 10;
    o.server_queued = absl::GetFlag(FLAGS_server_max_queued_requests);
    add(run_ucx_flood(client, server, o));
  }
  if (absl::GetFlag(FLAGS_ucx_stall) > 0) {
    ucx_stall_options o;
    o.connections = absl::GetFlag(FLAGS_ucx_stall);
    o.body_bytes = static_cast<std::uint32_t>(std::max(1, absl::GetFlag(FLAGS_stall_kib))) << 10;
    o.until_file = absl::GetFlag(FLAGS_stall_until_file);
    add(run_ucx_stall(client, server, o));
  }
  return problems;
}

}  // namespace dlasync::examples
