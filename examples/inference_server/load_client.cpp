// dlasync_load: a load generator for dlasync_server's KServe v2 fronts.
//
// Opens N connections over one transport (REST, gRPC or UCX) and, for a
// given time, sends requests on each one after the other to the server's
// `sum` model, with known sums, checked against every answer
// (load_kserve.hpp). With --malformed, a share of the requests are malformed
// on purpose (an unknown model or input, a wrong datatype, contents of the
// wrong size, an absurd shape, bodies that are not requests, and with the
// server's limits given, requests over them); each must get the refusal it
// deserves, and the connection must go on working (or, where the server
// rightly closes it, the client reconnects). With --slow_peers, some HTTP
// connections announce a body and send it a byte at a time: the server must
// disconnect them at its read deadline while the other connections, opened
// after them, are answered. Over UCX, --ucx_stall, --ucx_flood and
// --ucx_garbage run peers that misbehave instead (ucx_hostile_peers.hpp).
//
// Prints throughput, latency percentiles of the valid requests and the
// outcome counts; exits 0 only when every answer was the one expected.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "asio/co_spawn.hpp"
#include "asio/io_context.hpp"
#include "asio/ip/tcp.hpp"
#include "asio/strand.hpp"
#include "asio/use_future.hpp"
#include "common/flags.hpp"
#include "common/stats.hpp"
#include "load_kserve.hpp"
#include "slow_peer.hpp"
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
#include "ucx_client.hpp"
#include "ucx_hostile_peers.hpp"
#endif

ABSL_FLAG(std::string, host, "127.0.0.1", "Server address.");
ABSL_FLAG(std::string, transport, "rest",
          "rest: KServe v2 over HTTP/1.1 with binary tensor data (--http_port); grpc: its gRPC "
          "service (--grpc_port); ucx: the gRPC messages as UCX active messages (--ucx_port; "
          "needs dlasync built with UCX).");
ABSL_FLAG(int, http_port, 8000, "The server's HTTP port (--transport=rest, --slow_peers).");
ABSL_FLAG(int, grpc_port, 8001, "The server's gRPC port (--transport=grpc).");
ABSL_FLAG(int, ucx_port, 5556, "The server's UCX port (--transport=ucx).");
ABSL_FLAG(int, connections, 8, "Connections, each sending requests one after the other.");
ABSL_FLAG(double, seconds, 5, "How long to send.");
ABSL_FLAG(int, max_elements, 65536, "Largest tensor, in elements.");
ABSL_FLAG(double, malformed, 0, "Share of requests (0 to 1) that are malformed on purpose.");
ABSL_FLAG(int, server_max_request_mib, 0,
          "The server's --max_request_mib; when set, some malformed requests exceed it.");
ABSL_FLAG(int, server_budget_mib, 0,
          "The server's --memory_budget_mib, when below its request limit: adds requests larger "
          "than the budget, which must be refused with ResourceExhausted.");
ABSL_FLAG(int, server_connection_budget_mib, 0,
          "The server's --connection_budget_mib, when below its request limit and its memory "
          "budget: adds requests larger than one connection may hold, which must be refused "
          "with ResourceExhausted (REST and UCX).");
ABSL_FLAG(int, slow_peers, 0,
          "Extra HTTP connections, opened first, that announce a body of --slow_body_kib and send "
          "it a byte every --slow_interval_ms; the server must disconnect each of them within "
          "--slow_seconds.");
ABSL_FLAG(int, slow_body_kib, 1024, "The body a slow peer announces, in KiB.");
ABSL_FLAG(int, slow_interval_ms, 100, "Time between two bytes of a slow peer.");
ABSL_FLAG(double, slow_seconds, 10, "How long a slow peer may stay connected.");
ABSL_FLAG(std::uint32_t, seed, 1, "Random seed.");
ABSL_FLAG(std::string, ucx_transports, "",
          "UCX transports (UCX_TLS's syntax; empty: UCX's choice), --transport=ucx.");
ABSL_FLAG(int, threads, 2, "Client threads (REST's connections; UCX's progress).");
ABSL_FLAG(bool, remote_inputs, false,
          "--transport=ucx: publish each valid request's input as a remote bundle and send the "
          "bundle instead of the bytes (the server runs with --allow_remote_inputs).");
ABSL_FLAG(std::string, remote_address, "127.0.0.1",
          "--remote_inputs: the address of this host that the server reaches, where the "
          "bundles are published.");

namespace dlasync::examples {
namespace {

using asio::ip::tcp;

std::uint32_t mib_flag(const absl::Flag<int>& flag) {
  return static_cast<std::uint32_t>(std::max(0, absl::GetFlag(flag))) << 20;
}

// Slow peers on a thread of their own, started before the load and waited
// for after it.
class slow_peers {
 public:
  slow_peers(const tcp::endpoint& server, int count) : count_(count) {
    if (count <= 0) return;
    slow_peer_options o;
    o.announced_bytes = static_cast<std::uint32_t>(std::max(1, absl::GetFlag(FLAGS_slow_body_kib)))
                        << 10;
    o.interval = std::chrono::milliseconds(absl::GetFlag(FLAGS_slow_interval_ms));
    o.give_up_after = std::chrono::milliseconds(
        static_cast<std::int64_t>(absl::GetFlag(FLAGS_slow_seconds) * 1000));
    o.host = absl::GetFlag(FLAGS_host);
    for (int i = 0; i < count; ++i) {
      done_.push_back(
          asio::co_spawn(asio::make_strand(io_), slow_peer(server, o, stats_), asio::use_future));
    }
    thread_ = std::thread([this] { io_.run(); });
    // The load starts once they hold their room (2 s at most).
    for (int i = 0; i < 200 && stats_.started.load() < count; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  slow_peers(const slow_peers&) = delete;
  slow_peers& operator=(const slow_peers&) = delete;
  ~slow_peers() { wait(); }

  // Waits for them all to end, then prints what they saw and hands their
  // problems to `stats`.
  void report(load_stats& stats) {
    if (count_ <= 0) return;
    wait();
    std::sort(stats_.disconnected_after_ms.begin(), stats_.disconnected_after_ms.end());
    std::printf(
        "  slow peers disconnected by the server: %d of %d (after %.0f to %.0f ms; %d told "
        "DeadlineExceeded)\n",
        stats_.disconnected.load(), count_,
        stats_.disconnected_after_ms.empty() ? 0.0 : stats_.disconnected_after_ms.front(),
        stats_.disconnected_after_ms.empty() ? 0.0 : stats_.disconnected_after_ms.back(),
        stats_.told_deadline.load());
    for (std::string& p : stats_.problems) stats.problem(std::move(p));
    stats_.problems.clear();
  }

 private:
  void wait() {
    if (thread_.joinable()) thread_.join();
    for (std::future<void>& f : done_) f.get();
    done_.clear();
  }

  const int count_;
  asio::io_context io_;
  slow_peer_stats stats_;
  std::vector<std::future<void>> done_;
  std::thread thread_;
};

#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
// The misbehaving UCX peers, in place of load; their problems into `stats`.
void run_hostile_ucx(const kserve_load& load, load_stats& stats) {
  with_ucx_client(absl::GetFlag(FLAGS_ucx_transports), 1, stats, [&](ucx_client& client) {
    for (std::string& p : run_ucx_hostile(client, {load.host, load.port})) {
      stats.problem(std::move(p));
    }
  });
}
#endif

int run() {
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "rest" && transport != "grpc" && transport != "ucx") {
    std::fprintf(stderr, "dlasync_load: --transport=%s: rest, grpc or ucx\n", transport.c_str());
    return 2;
  }
  asio::error_code ec;
  const tcp::endpoint http_server(asio::ip::make_address(absl::GetFlag(FLAGS_host), ec),
                                  static_cast<unsigned short>(absl::GetFlag(FLAGS_http_port)));
  if (ec) {
    std::fprintf(stderr, "dlasync_load: --host=%s: %s\n", absl::GetFlag(FLAGS_host).c_str(),
                 ec.message().c_str());
    return 2;
  }
  load_stats stats;
  const clock::time_point start = clock::now();
  slow_peers slow(http_server, absl::GetFlag(FLAGS_slow_peers));
  kserve_load load;
  load.host = absl::GetFlag(FLAGS_host);
  load.connections = absl::GetFlag(FLAGS_connections);
  load.stop_at = clock::now() + std::chrono::duration_cast<clock::duration>(
                                    std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
  load.max_elements = absl::GetFlag(FLAGS_max_elements);
  load.malformed = absl::GetFlag(FLAGS_malformed);
  load.seed = absl::GetFlag(FLAGS_seed);
  load.server = {mib_flag(FLAGS_server_max_request_mib), mib_flag(FLAGS_server_budget_mib),
                 mib_flag(FLAGS_server_connection_budget_mib)};
  load.threads = absl::GetFlag(FLAGS_threads);
  if (absl::GetFlag(FLAGS_remote_inputs))
    load.remote_inputs_address = absl::GetFlag(FLAGS_remote_address);
  bool hostile = false;  // misbehaving peers, which send no load
  if (transport == "rest") {
    load.port = absl::GetFlag(FLAGS_http_port);
    run_rest(load, stats);
  } else if (transport == "grpc") {
    load.port = absl::GetFlag(FLAGS_grpc_port);
    run_grpc(load, stats);
  } else {
    load.port = absl::GetFlag(FLAGS_ucx_port);
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
    hostile = ucx_hostile_requested();
    if (hostile) run_hostile_ucx(load, stats);
#endif
    if (!hostile) run_ucx(load, absl::GetFlag(FLAGS_ucx_transports), stats);
  }
  const double seconds = std::chrono::duration<double>(clock::now() - start).count();

  std::printf("dlasync load: %d connections over %s, %.1f s\n", load.connections, transport.c_str(),
              seconds);
  std::printf("  valid requests answered correctly: %llu (%.0f/s, %.1f MB/s sent)\n",
              static_cast<unsigned long long>(stats.valid_ok.load()),
              static_cast<double>(stats.valid_ok.load()) / seconds,
              static_cast<double>(stats.bytes_sent.load()) / seconds / 1e6);
  std::printf("  latency us: p50 %.0f  p90 %.0f  p99 %.0f  max %.0f\n",
              stats.latency.percentile_us(50), stats.latency.percentile_us(90),
              stats.latency.percentile_us(99), stats.latency.percentile_us(100));
  std::printf("  malformed requests answered as expected: %llu (%llu reconnects)\n",
              static_cast<unsigned long long>(stats.malformed_answered.load()),
              static_cast<unsigned long long>(stats.reconnects.load()));
  slow.report(stats);
  std::printf("  wrong or missing answers: %llu\n",
              static_cast<unsigned long long>(stats.wrong.load()));
  for (const std::string& p : stats.problems) std::printf("  problem: %s\n", p.c_str());
  return stats.wrong.load() == 0 && (hostile || stats.valid_ok.load() > 0) ? 0 : 1;
}

}  // namespace
}  // namespace dlasync::examples

// NOLINTNEXTLINE(bugprone-exception-escape): what escapes main ends the program with its message
int main(int argc, char** argv) {
  dlasync::examples::parse_flags(
      argc, argv,
      "Drives dlasync_server's KServe v2 fronts with N connections for a given time, checks "
      "every answer, and prints throughput and latency percentiles.\n\n"
      "  dlasync_load [--transport=rest|grpc|ucx] [--http_port=8000] [--connections=8] "
      "[--seconds=5] [--malformed=0.2] ...");
  return dlasync::examples::run();
}
