// dlasync_server: an inference server that speaks the Open Inference
// Protocol (KServe v2) over HTTP/1.1 (http_front.hpp), gRPC (grpc_front.hpp)
// and, where dlasync has UCX, the gRPC messages as UCX active messages
// (ucx_front.hpp).
//
// Each request names a model (kserve_models.hpp) and carries its input
// tensors, or names shared-memory regions that hold them. The server wraps
// the received bytes as DLPack tensors, `co_await`s their import onto the
// configured device (a GPU when there is one, real or simulated, else the
// host) and runs the model there. Connections are served concurrently; the
// requests of one HTTP connection in order. A malformed request gets an error
// naming the problem and the connection goes on, unless the request cannot
// be told from the next. Received requests are bounded by a memory budget: a
// request waits for room, and one larger than the whole budget, or than the
// share one connection may hold, is refused. Slow peers are cut off: a
// request must arrive within a deadline, and a connection silent between
// requests is closed. The server holds at most --max_connections HTTP, gRPC and
// UCX connections and refuses the others at once; an accept that fails (no
// descriptor left) is retried after a wait.
//
// SIGINT or SIGTERM stops the server, which then prints its report and the
// runtime's counters (runtime::stats); SIGUSR1 prints those counters and
// the server goes on.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "accept_loop.hpp"
#include "asio/ip/tcp.hpp"
#include "asio/post.hpp"
#include "asio/signal_set.hpp"
#include "asio/steady_timer.hpp"
#include "asio/strand.hpp"
#include "common/device_sum.hpp"
#include "common/flags.hpp"
#include "common/target.hpp"
#include "connection_limit.hpp"
#include "dlasync/dlasync.hpp"
#include "grpc_front.hpp"
#include "http_front.hpp"
#include "kserve_models.hpp"
#include "server_stats.hpp"
#include "shm_registry.hpp"
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
#include "kserve_service.hpp"
#include "remote_inputs.hpp"
#include "ucx_front.hpp"
#endif

ABSL_FLAG(std::string, address, "127.0.0.1", "Address to listen on.");
ABSL_FLAG(std::string, device, "auto",
          "Where tensors are imported and summed: auto (the first GPU when there is one, else "
          "the host), cpu, or cuda:N.");
ABSL_FLAG(int, sim_gpus, 0, "Use this many simulated GPUs instead of real ones.");
ABSL_FLAG(int, max_request_mib, 64,
          "Largest request accepted (an HTTP body, a gRPC or UCX message), in MiB (1 to 2047).");
ABSL_FLAG(int, memory_budget_mib, 256,
          "Bytes that received requests may hold at once, in MiB (their copies on the device "
          "are bounded by the same amount).");
ABSL_FLAG(int, connection_budget_mib, 0,
          "Most of the memory budget one connection may hold, in MiB; a larger request is "
          "refused (0: a quarter of --memory_budget_mib).");
ABSL_FLAG(int, read_timeout_ms, 5000,
          "A request's head, from its first byte, and its body must each arrive, and each reply "
          "be taken, within this many milliseconds, else the connection is closed (0: no limit).");
ABSL_FLAG(int, idle_timeout_ms, 60000,
          "A connection that starts no request for this many milliseconds is closed (0: no "
          "limit).");
ABSL_FLAG(int, max_connections, 0,
          "Connections held at once, over HTTP, gRPC and UCX together; more are refused at once "
          "(0: three quarters of the descriptors left free once the server listens, from "
          "RLIMIT_NOFILE).");
ABSL_FLAG(int, threads, 2, "Threads running the server's and dlasync's executor.");
ABSL_FLAG(double, seconds, 0, "Stop after this many seconds (0: run until SIGINT or SIGTERM).");
ABSL_FLAG(int, ucx_port, -1,
          "Also serve the gRPC front's messages as UCX active messages on this port (0 picks a "
          "free one, see --ucx_port_file; -1: no UCX transport). Needs dlasync built with UCX.");
ABSL_FLAG(int, http_port, 8000,
          "Serve the Open Inference Protocol (KServe v2) over HTTP/1.1 on this port (0 picks a "
          "free one, see --http_port_file; -1: no REST front).");
ABSL_FLAG(std::string, http_port_file, "", "Write the HTTP port to this file once listening.");
ABSL_FLAG(int, grpc_port, -1,
          "Also serve the Open Inference Protocol's gRPC service (inference."
          "GRPCInferenceService) on this port (0 picks a free one, see --grpc_port_file; -1: no "
          "gRPC front).");
ABSL_FLAG(std::string, grpc_port_file, "", "Write the gRPC port to this file once listening.");
ABSL_FLAG(int, http_max_header_kib, 16,
          "Largest HTTP request head (request line and headers) accepted, in KiB; a larger one "
          "gets 431 and the connection is closed.");
ABSL_FLAG(bool, allow_client_shm, false,
          "Serve the system shared-memory extension: clients may register POSIX "
          "shared-memory objects and name them in requests instead of sending the bytes.");
ABSL_FLAG(bool, allow_remote_inputs, false,
          "Over the UCX transport, take inputs that a request names in a remote bundle "
          "(dlasync_bundle): fetch them from the client's host with dlasync::remote.");
ABSL_FLAG(std::string, remote_input_ports, "1024-65535",
          "With --allow_remote_inputs, the ports of the client's host a bundle may name as its "
          "exporter's (LOW-HIGH); by default none below 1024.");
ABSL_FLAG(std::string, ucx_port_file, "", "Write the UCX port to this file once listening.");
ABSL_FLAG(std::string, ucx_transports, "",
          "UCX transports for the UCX listener (UCX_TLS's syntax; empty: UCX's choice).");
ABSL_FLAG(int, max_queued_requests, 16,
          "Requests one UCX connection may have waiting for room in the memory budget; more are "
          "refused with ResourceExhausted.");
ABSL_FLAG(int, max_queued_kib, 256,
          "Bytes (eagerly sent data, in KiB) that one UCX connection's requests "
          "waiting for room may hold; more are refused with ResourceExhausted.");

namespace dlasync::examples {
namespace {

using asio::ip::tcp;

// LOW-HIGH into `low` and `high` (1 to 65535, low at most high): OK, or
// InvalidArgument naming --remote_input_ports.
absl::Status port_range(const std::string& text, std::uint16_t& low, std::uint16_t& high) {
  const std::vector<std::string> parts = absl::StrSplit(text, '-');
  int lo = 0;
  int hi = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &lo) || !absl::SimpleAtoi(parts[1], &hi) ||
      lo < 1 || hi > 65535 || lo > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--remote_input_ports=", text,
                     ": give LOW-HIGH, ports from 1 to 65535, such as 1024-65535"));
  }
  low = static_cast<std::uint16_t>(lo);
  high = static_cast<std::uint16_t>(hi);
  return absl::OkStatus();
}

// Resident set size of this process in MiB, from /proc.
double rss_mib() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t pages = 0;
  std::uint64_t resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

// The runtime's counters, in the text the pipeline example prints too.
void print_runtime_stats(const runtime& rt) {
  std::printf("dlasync runtime stats:\n%s\n", to_string(rt.stats()).c_str());
  std::fflush(stdout);
}

// Says that the server listens for `what` on `port`, and writes the port
// to `port_file` when one is named (tests wait for it there).
void announce(const char* what, unsigned port, const std::string& port_file) {
  std::printf("dlasync server listening for %s on %s:%u\n", what,
              absl::GetFlag(FLAGS_address).c_str(), port);
  std::fflush(stdout);
  if (!port_file.empty()) std::ofstream(port_file) << port << "\n";
}

// Opens `acceptor` on --address and `port`, listening.
asio::error_code listen_on(tcp::acceptor& acceptor, int port) {
  asio::error_code ec;
  const tcp::endpoint endpoint(asio::ip::make_address(absl::GetFlag(FLAGS_address), ec),
                               static_cast<unsigned short>(port));
  if (!ec) acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::fprintf(stderr, "dlasync_server: cannot listen on %s:%d: %s\n",
                 absl::GetFlag(FLAGS_address).c_str(), port, ec.message().c_str());
  }
  return ec;
}

int run() {
  // Flags that can be wrong: refused before anything starts.
  std::uint16_t remote_low = 0;
  std::uint16_t remote_high = 0;
  if (const absl::Status ports =
          port_range(absl::GetFlag(FLAGS_remote_input_ports), remote_low, remote_high);
      !ports.ok()) {
    std::fprintf(stderr, "dlasync_server: %s\n", std::string(ports.message()).c_str());
    return 2;
  }
  const std::uint64_t budget =
      static_cast<std::uint64_t>(std::max(1, absl::GetFlag(FLAGS_memory_budget_mib))) << 20;
  runtime_options ro;
  ro.executor_threads = std::max(1, absl::GetFlag(FLAGS_threads));
  ro.copy_memory_budget = budget;
  // Freed copy buffers kept for reuse count against the same bound, so that
  // the memory held stays within a small multiple of the budget.
  ro.host_cache_bytes = budget;
  if (absl::GetFlag(FLAGS_sim_gpus) > 0)
    ro.cuda = absl::StrCat("sim:", absl::GetFlag(FLAGS_sim_gpus));
  absl::StatusOr<std::unique_ptr<runtime>> created = runtime::create(ro);
  if (!created.ok()) {
    std::fprintf(stderr, "dlasync_server: %s\n", created.status().ToString().c_str());
    return 2;
  }
  runtime& rt = **created;
  absl::StatusOr<device> target = choose_target(rt, absl::GetFlag(FLAGS_device));
  if (!target.ok()) {
    std::fprintf(stderr, "dlasync_server: %s\n", std::string(target.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<device_sum>> compute = device_sum::create(rt);
  if (!compute.ok()) {
    std::fprintf(stderr, "dlasync_server: %s\n", compute.status().ToString().c_str());
    return 2;
  }
  server_limits limits;
  limits.max_body = static_cast<std::uint32_t>(std::min<std::uint64_t>(
      static_cast<std::uint64_t>(std::clamp(absl::GetFlag(FLAGS_max_request_mib), 1, 2047)) << 20,
      std::numeric_limits<std::uint32_t>::max()));
  limits.budget = budget;
  limits.connection_budget =
      absl::GetFlag(FLAGS_connection_budget_mib) > 0
          ? static_cast<std::uint64_t>(absl::GetFlag(FLAGS_connection_budget_mib)) << 20
          : budget / 4;
  limits.read_timeout =
      std::chrono::milliseconds(std::max(0, absl::GetFlag(FLAGS_read_timeout_ms)));
  limits.idle_timeout =
      std::chrono::milliseconds(std::max(0, absl::GetFlag(FLAGS_idle_timeout_ms)));
  const double rss_start = rss_mib();
  auto memory = std::make_shared<memory_budget>(limits.budget);
  server_stats stats;
  kserve::model_handler models(rt, **compute, *target);
  kserve::shm_registry shm(absl::GetFlag(FLAGS_allow_client_shm));
  // Freed request buffers kept for reuse, up to half the budget again.
  buffer_pool pool(budget / 2);
  http_front http(
      models, shm, memory, pool, limits,
      static_cast<std::size_t>(std::max(1, absl::GetFlag(FLAGS_http_max_header_kib))) << 10, stats);

  std::printf("dlasync server computing on %s\n", device_label(rt, *target).c_str());
  std::fflush(stdout);
  const std::shared_ptr<connection_limit> connections =
      connection_limit::create(absl::GetFlag(FLAGS_max_connections) > 0
                                   ? static_cast<std::size_t>(absl::GetFlag(FLAGS_max_connections))
                                   : default_max_connections());
  std::printf("dlasync server holds at most %zu connections at once (--max_connections)\n",
              connections->max());
  std::fflush(stdout);

  std::promise<void> stop;
  std::once_flag stopping;
  auto request_stop = [&] { std::call_once(stopping, [&] { stop.set_value(); }); };
  asio::signal_set signals(rt.get_executor(), SIGINT, SIGTERM);
  signals.async_wait([&](const asio::error_code& e, int) {
    if (!e) request_stop();
  });
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
  std::unique_ptr<ucx_front> ucx;
  std::atomic<const ucx_front*> ucx_view{nullptr};  // for SIGUSR1, once it listens
  std::unique_ptr<kserve::remote_inputs> remote;    // --allow_remote_inputs
#endif
  asio::signal_set report(rt.get_executor(), SIGUSR1);
  std::function<void()> report_on_signal = [&] {
    report.async_wait([&](const asio::error_code& e, int) {
      if (e) return;
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
      if (const ucx_front* front = ucx_view.load()) {
        const ucx_front::in_progress n = front->requests_in_progress();
        std::printf(
            "dlasync server UCX requests: %zu waiting for room, %zu bodies arriving, %zu being "
            "handled\n",
            n.waiting, n.receiving, n.handling);
      }
#endif
      print_runtime_stats(rt);
      report_on_signal();
    });
  };
  report_on_signal();
  asio::steady_timer deadline(rt.get_executor());
  if (absl::GetFlag(FLAGS_seconds) > 0) {
    deadline.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(
        std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds))));
    deadline.async_wait([&](const asio::error_code& e) {
      if (!e) request_stop();
    });
  }
  // Each accepted connection is served on a strand of its own.
  const accept_loop::executor_fn strand_per_connection = [&rt] {
    return asio::any_io_executor(asio::make_strand(rt.get_executor()));
  };
  // On a strand: the accept loop and its stop touch the acceptor in turn.
  tcp::acceptor http_acceptor(asio::make_strand(rt.get_executor()));
  std::optional<accept_loop> http_accepting;
  if (absl::GetFlag(FLAGS_http_port) >= 0) {
    if (listen_on(http_acceptor, absl::GetFlag(FLAGS_http_port))) {
      request_stop();
    } else {
      announce("HTTP (KServe v2)", http_acceptor.local_endpoint().port(),
               absl::GetFlag(FLAGS_http_port_file));
      http_accepting.emplace(
          http_acceptor, connections, accept_backoff{},
          [&http](tcp::socket socket, connection_limit::slot slot) {
            http.serve_connection(std::move(socket), std::move(slot));
          },
          [max = connections->max()](tcp::socket& socket) {
            http_front::refuse_connection(socket, max);
          },
          strand_per_connection);
      http_accepting->start();
    }
  }
  std::unique_ptr<grpc_front> grpc;
  tcp::acceptor grpc_acceptor(asio::make_strand(rt.get_executor()));
  std::optional<accept_loop> grpc_accepting;
  if (absl::GetFlag(FLAGS_grpc_port) >= 0) {
    grpc_front::options go;
    go.max_message = limits.max_body;
    go.memory_quota = limits.budget + limits.max_body;
    go.idle_timeout = limits.idle_timeout;
    go.stop_grace = limits.read_timeout;
    absl::StatusOr<std::unique_ptr<grpc_front>> started =
        grpc_front::start(go, rt.get_executor(), models, shm, memory, pool, stats);
    if (!started.ok()) {
      std::fprintf(stderr, "dlasync_server: %s\n", started.status().ToString().c_str());
      request_stop();
    } else if (listen_on(grpc_acceptor, absl::GetFlag(FLAGS_grpc_port))) {
      request_stop();
    } else {
      grpc = *std::move(started);
      announce("gRPC (KServe v2)", grpc_acceptor.local_endpoint().port(),
               absl::GetFlag(FLAGS_grpc_port_file));
      // gRPC's connections count against --max_connections too: accepted
      // here, handed to gRPC; one past the limit is closed at once (gRPC has
      // no answer to give before its own handshake).
      grpc_accepting.emplace(
          grpc_acceptor, connections, accept_backoff{},
          [&grpc, &stats](tcp::socket socket, connection_limit::slot slot) {
            stats.connections.fetch_add(1);
            grpc->adopt(std::move(socket), std::move(slot));
          },
          [](tcp::socket&) {}, strand_per_connection);
      grpc_accepting->start();
    }
  }
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
  if (absl::GetFlag(FLAGS_ucx_port) >= 0) {
    ucx_front::options uo;
    uo.address = absl::GetFlag(FLAGS_address);
    uo.port = absl::GetFlag(FLAGS_ucx_port);
    uo.transports = absl::GetFlag(FLAGS_ucx_transports);
    uo.max_body = limits.max_body;
    uo.connection_budget = limits.connection_budget;
    uo.read_timeout = limits.read_timeout;
    uo.max_queued_requests =
        static_cast<std::size_t>(std::max(0, absl::GetFlag(FLAGS_max_queued_requests)));
    uo.max_queued_bytes =
        static_cast<std::uint64_t>(std::max(0, absl::GetFlag(FLAGS_max_queued_kib))) << 10;
    uo.connections = connections;
    if (absl::GetFlag(FLAGS_allow_remote_inputs)) {
      kserve::remote_inputs::options ro;
      ro.transports = uo.transports;
      ro.timeout = std::max(limits.read_timeout, std::chrono::milliseconds(1000));
      ro.min_port = remote_low;
      ro.max_port = remote_high;
      absl::StatusOr<std::unique_ptr<kserve::remote_inputs>> r =
          kserve::remote_inputs::create(rt, ro);
      if (!r.ok()) {
        std::fprintf(stderr, "dlasync_server: --allow_remote_inputs: %s\n",
                     r.status().ToString().c_str());
        request_stop();
      } else {
        remote = *std::move(r);
      }
    }
    // The same messages, and the same handler, as the gRPC front's, and
    // inputs named in a remote bundle where allowed.
    const kserve::message_server messages{models, shm, *memory, pool, remote.get()};
    auto answer = [messages](ucx_front::message m) {
      kserve::serialized_message s = kserve::serialized_message::of(std::move(m.bytes), m.length);
      s.peer = std::move(m.peer);
      return messages.answer_serialized(std::move(s), std::move(m.room));
    };
    absl::StatusOr<std::unique_ptr<ucx_front>> front =
        ucx_front::create(rt.get_executor(), uo, memory, answer,
                          [&stats](absl::StatusCode code) { stats.count_answer(code); });
    if (!front.ok()) {
      std::fprintf(stderr, "dlasync_server: %s\n", front.status().ToString().c_str());
      request_stop();
    } else {
      ucx = *std::move(front);
      ucx_view.store(ucx.get());
      announce("UCX", ucx->port(), absl::GetFlag(FLAGS_ucx_port_file));
    }
  }
#else
  if (absl::GetFlag(FLAGS_ucx_port) >= 0) {
    std::fprintf(stderr, "dlasync_server: --ucx_port: this build has no UCX (libucx-dev)\n");
    request_stop();
  }
#endif
  if (absl::GetFlag(FLAGS_allow_remote_inputs) && absl::GetFlag(FLAGS_ucx_port) < 0) {
    std::fprintf(stderr,
                 "dlasync_server: --allow_remote_inputs takes bundles over the UCX transport: "
                 "give --ucx_port too\n");
    request_stop();
  }
  stop.get_future().wait();
  if (grpc_accepting) grpc_accepting->stop();
  if (grpc) grpc->stop();  // waits for the calls under way
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
  // Fetches of remote bundles under way end (Cancelled), so that the UCX
  // handlers waiting on them finish.
  if (remote) remote->shutdown();
  if (ucx) {
    ucx->stop();
    const ucx_front::counters u = ucx->stats();
    std::printf(
        "dlasync server UCX transport: %llu connections, %.1f MiB received; %llu connections "
        "refused over --max_connections, %llu closed past the read deadline; %llu requests "
        "refused over the queue bounds\n",
        static_cast<unsigned long long>(u.connections),
        static_cast<double>(u.bytes_received) / (1 << 20),
        static_cast<unsigned long long>(u.refused_connections),
        static_cast<unsigned long long>(u.closed_late),
        static_cast<unsigned long long>(u.refused_queue));
  }
#endif

  if (http_accepting) http_accepting->stop();
  asio::post(rt.get_executor(), [&] {
    asio::error_code ignored;
    signals.cancel(ignored);
    report.cancel(ignored);
    deadline.cancel();
  });
  http.close_all();
  rt.shutdown();
  const server_stats& s = stats;
  std::printf(
      "dlasync server stopped: %llu connections, %llu requests answered OK, %llu with an "
      "error, %llu connections closed for lost framing, %.1f MiB received; RSS %.1f MiB at "
      "start, %.1f MiB at the end\n",
      static_cast<unsigned long long>(s.connections.load()),
      static_cast<unsigned long long>(s.answered_ok.load()),
      static_cast<unsigned long long>(s.answered_error.load()),
      static_cast<unsigned long long>(s.closed_unframed.load()),
      static_cast<double>(s.bytes_received.load()) / (1 << 20), rss_start, rss_mib());
  std::printf(
      "dlasync server deadlines: %llu connections closed past the read deadline, %llu closed "
      "idle; %llu requests refused over the connection budget\n",
      static_cast<unsigned long long>(s.closed_late.load()),
      static_cast<unsigned long long>(s.closed_idle.load()),
      static_cast<unsigned long long>(s.refused_connection_budget.load()));
  std::uint64_t accept_failures = 0;
  std::uint64_t accept_bursts = 0;
  for (const std::optional<accept_loop>* loop : {&http_accepting, &grpc_accepting}) {
    if (!loop->has_value()) continue;
    accept_failures += (*loop)->stats().failures.load();
    accept_bursts += (*loop)->stats().bursts.load();
  }
  std::printf(
      "dlasync server connections: %llu refused over --max_connections=%zu (at most %zu held at "
      "once); %llu accepts failed, in %llu bursts\n",
      static_cast<unsigned long long>(connections->refused()), connections->max(),
      connections->peak(), static_cast<unsigned long long>(accept_failures),
      static_cast<unsigned long long>(accept_bursts));
  // Every request's body goes back to the budget when its last user, the
  // imported tensor's DLPack deleter included, lets go of it.
  std::printf("dlasync server memory budget: %llu bytes in use at the end, of %llu\n",
              static_cast<unsigned long long>(memory->in_use()),
              static_cast<unsigned long long>(memory->limit()));
  for (const auto& [code, count] : stats.errors_by_code) {
    std::printf("  errors %s: %llu\n", code.c_str(), static_cast<unsigned long long>(count));
  }
  print_runtime_stats(rt);
  return 0;
}

}  // namespace
}  // namespace dlasync::examples

// NOLINTNEXTLINE(bugprone-exception-escape): what escapes main ends the program with its message
int main(int argc, char** argv) {
  dlasync::examples::parse_flags(
      argc, argv,
      "Serves the Open Inference Protocol (KServe v2) over HTTP/1.1, gRPC and UCX: imports each "
      "request's tensors onto the device with dlasync and runs the model there.\n\n"
      "  dlasync_server [--http_port=8000] [--grpc_port=8001] [--device=auto|cpu|cuda:N] "
      "[--sim_gpus=N] ...");
  return dlasync::examples::run();
}
