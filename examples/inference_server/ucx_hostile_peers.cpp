#include "ucx_hostile_peers.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "kserve_requests.hpp"
#include "ucx_protocol.hpp"

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

// A valid request for the `sum` model whose message takes at most
// `message_bytes` (at least 64): FP32 ones, so that its sum is their count.
std::uint32_t ones_count(std::uint32_t message_bytes) {
  return std::max<std::uint32_t>(message_bytes, 64) / 4 - 16;
}

struct ones_request {
  ones_request(std::uint64_t tag, std::uint32_t message_bytes) : count(ones_count(message_bytes)) {
    const std::vector<float> ones(count, 1.0F);
    message = kserve::serialize(kserve::sum_request(std::to_string(tag), ones));
  }
  std::uint32_t count;
  std::vector<std::byte> message;
};

bool is_ones_answer(const ucx_answer& a, std::uint32_t message_bytes) {
  if (a.code != absl::StatusCode::kOk) return false;
  const absl::StatusOr<double> sum = kserve::sum_of(a.bytes, std::to_string(a.tag));
  return sum.ok() && *sum == ones_count(message_bytes);
}

std::string describe(const absl::StatusOr<ucx_answer>& r) {
  if (!r.ok()) return r.status().ToString();
  if (r->code == absl::StatusCode::kOk) return absl::StrCat("OK (tag ", r->tag, ")");
  return absl::StrCat(absl::StatusCodeToString(r->code), " (", r->bytes, ")");
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
  const absl::Status sent = client.send(*c, 1, ones_request(1, body_bytes).message, rendezvous);
  if (!sent.ok()) return sent;
  const absl::StatusOr<ucx_answer> r = client.receive(*c, 10s);
  if (!r.ok() || !is_ones_answer(*r, body_bytes)) {
    return absl::UnavailableError(absl::StrCat("a first request was not answered: ", describe(r)));
  }
  return c;
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
  const absl::Status stalled =
      client.stall(connections, 2, ones_request(2, options.body_bytes).message, [&] {
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
    const absl::StatusOr<ucx_answer> r = client.receive(c, 10s);
    if (r.ok() && is_ones_answer(*r, options.body_bytes)) {
      ++answered;
    } else if (r.ok() && r->code == absl::StatusCode::kDeadlineExceeded &&
               r->bytes.find("--read_timeout_ms") != std::string::npos) {
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
  const ones_request request(0, options.body_bytes);
  for (int i = 0; i < options.requests; ++i) {
    // One message for all: the tags differ, the ids (inside) do not matter.
    const absl::Status sent = client.send(*c, 0, request.message);
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
    const absl::StatusOr<ucx_answer> r = client.receive(*c, options.answer_within);
    if (!r.ok()) {
      problems.push_back(absl::StrCat("flood: ", options.requests - got,
                                      " requests unanswered: ", r.status().ToString()));
      break;
    }
    if (is_ones_answer(*r, options.body_bytes)) {
      ++answered;
    } else if (r->code == absl::StatusCode::kResourceExhausted &&
               r->bytes.find("--max_queued_") != std::string::npos) {
      ++refused;
    } else if (problems.size() < 10) {
      problems.push_back(absl::StrCat("flood: ", describe(*r)));
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
  const std::vector<std::byte> valid = ones_request(1, 4096).message;
  int expected = 0;  // messages with the reply flag: each gets one answer
  for (int i = 0; i < options.messages; ++i) {
    std::vector<std::byte> header(ucx_header_bytes);
    for (std::byte& b : header) b = static_cast<std::byte>(rng());
    const auto good = ucx_request_header(i).encode();
    std::size_t data = below(512);
    bool reply = true;
    // Rendezvous sizes (past UCX's eager limit) for a share of them.
    const std::size_t large = (64u << 10) + below(448u << 10);
    std::optional<std::size_t> cut;  // a valid request cut to this many bytes
    switch (below(7)) {
      case 0:  // a header of another size
        header.resize(below(2) == 0 ? below(ucx_header_bytes) : ucx_header_bytes + 1 + below(48));
        break;
      case 1:  // no way to answer
        reply = false;
        std::copy(good.begin(), good.end(), header.begin());
        break;
      case 2:  // a wrong magic, with a payload sent by rendezvous
        std::copy(good.begin() + 4, good.end(), header.begin() + 4);
        data = large;
        break;
      case 3:  // a reserved word that is not 0
        std::copy(good.begin(), good.end(), header.begin());
        header[4] = std::byte{1};
        break;
      case 4:  // any 16 bytes at all
        break;
      case 5:  // a valid request, cut short
        std::copy(good.begin(), good.end(), header.begin());
        cut = below(static_cast<std::uint32_t>(valid.size()));
        break;
      default:  // a valid header, and data that is no request
        std::copy(good.begin(), good.end(), header.begin());
        data = below(2) == 0 ? data : large;
        break;
    }
    absl::Status sent;
    if (cut) {
      // (Cut at a field's end, the message parses, as a request the model
      // refuses: either way it is answered.)
      sent = client.send(*c, static_cast<std::uint64_t>(i), std::span(valid).first(*cut));
    } else {
      sent =
          client.send_raw(*c, ucx_request_am, reply, header, data, static_cast<std::byte>(rng()));
    }
    if (!sent.ok()) return {absl::StrCat("garbage: message ", i, ": ", sent.ToString())};
    expected += reply ? 1 : 0;
  }
  // Every message that asked for an answer gets one; then, with nothing of
  // this connection's waiting, a valid request is answered OK. (Sent before
  // the answers came, it could be refused at the queue bounds, rightly.)
  std::vector<std::string> problems;
  int answers = 0;
  for (; answers < expected; ++answers) {
    const absl::StatusOr<ucx_answer> r = client.receive(*c, 30s);
    if (!r.ok()) {
      problems.push_back(absl::StrCat("garbage: ", expected - answers,
                                      " messages unanswered: ", r.status().ToString()));
      break;
    }
  }
  constexpr std::uint64_t last_tag = 7777777;
  const absl::StatusOr<ucx_answer> r =
      client.call(*c, last_tag, ones_request(last_tag, 256).message, 30s);
  const bool last_ok = r.ok() && r->tag == last_tag && is_ones_answer(*r, 256);
  if (!last_ok) {
    problems.push_back(
        absl::StrCat("garbage: the valid request after it was not answered OK: ", describe(r)));
  }
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
