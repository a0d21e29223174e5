// dlasync_server: a TCP inference server.
//
// Each connection sends request frames (frame.hpp): a tensor's dtype, shape,
// strides and payload. The server wraps the received payload as a DLPack
// tensor, `co_await`s its import onto the configured device (a GPU when there
// is one, real or simulated, else the host), sums its elements there and
// replies with the sum. Connections are served concurrently; the requests of
// one connection in order. A malformed frame gets an error response naming
// the problem and the connection goes on with the next frame; only a wrong
// magic, after which the next frame cannot be found, closes the connection.
// Received frames are bounded by a memory budget: a request waits for room,
// and one larger than the whole budget, or than the share one connection may
// hold, is refused. Slow peers are cut off: each part of a frame must arrive
// within a deadline, and a connection silent between frames is closed.
//
// SIGINT or SIGTERM stops the server, which then prints its report and the
// runtime's counters (runtime::stats); SIGUSR1 prints those counters and
// the server goes on.
#include <unistd.h>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "asio/co_spawn.hpp"
#include "asio/detached.hpp"
#include "asio/experimental/as_tuple.hpp"
#include "asio/ip/tcp.hpp"
#include "asio/signal_set.hpp"
#include "asio/steady_timer.hpp"
#include "asio/strand.hpp"
#include "asio/use_awaitable.hpp"
#include "common/awaitables.hpp"
#include "common/device_sum.hpp"
#include "common/flags.hpp"
#include "common/target.hpp"
#include "dlasync/dlasync.hpp"
#include "frame.hpp"
#include "peer_io.hpp"
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
#include "ucx_front.hpp"
#endif

ABSL_FLAG(std::string, address, "127.0.0.1", "Address to listen on.");
ABSL_FLAG(int, port, 5555, "TCP port; 0 picks a free one (see --port_file).");
ABSL_FLAG(std::string, port_file, "", "Write the port listened on to this file once listening.");
ABSL_FLAG(std::string, device, "auto",
          "Where tensors are imported and summed: auto (the first GPU when there is one, else "
          "the host), cpu, or cuda:N.");
ABSL_FLAG(int, sim_gpus, 0, "Use this many simulated GPUs instead of real ones.");
ABSL_FLAG(int, max_frame_mib, 64, "Largest request body accepted, in MiB.");
ABSL_FLAG(int, memory_budget_mib, 256,
          "Bytes that received requests may hold at once, in MiB (their copies on the device "
          "are bounded by the same amount).");
ABSL_FLAG(int, connection_budget_mib, 0,
          "Most of the memory budget one connection may hold, in MiB; a larger request is "
          "refused (0: a quarter of --memory_budget_mib).");
ABSL_FLAG(int, read_timeout_ms, 5000,
          "A frame's header, from its first byte, and its body must each arrive, and each reply "
          "be taken, within this many milliseconds, else the connection is closed (0: no limit).");
ABSL_FLAG(int, idle_timeout_ms, 60000,
          "A connection that starts no frame for this many milliseconds is closed (0: no limit).");
ABSL_FLAG(int, threads, 2, "Threads running the server's and dlasync's executor.");
ABSL_FLAG(double, seconds, 0, "Stop after this many seconds (0: run until SIGINT or SIGTERM).");
ABSL_FLAG(int, ucx_port, -1,
          "Also serve the same requests over UCX active messages on this port (0 picks a free "
          "one, see --ucx_port_file; -1: no UCX transport). Needs dlasync built with UCX.");
ABSL_FLAG(std::string, ucx_port_file, "", "Write the UCX port to this file once listening.");
ABSL_FLAG(std::string, ucx_transports, "",
          "UCX transports for the UCX listener (UCX_TLS's syntax; empty: UCX's choice).");

namespace dlasync::examples {
namespace {

using asio::ip::tcp;
constexpr auto as_tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

struct server_stats {
  std::atomic<std::uint64_t> connections{0};
  std::atomic<std::uint64_t> answered_ok{0};
  std::atomic<std::uint64_t> answered_error{0};
  std::atomic<std::uint64_t> closed_unframed{0};
  std::atomic<std::uint64_t> closed_late{0};
  std::atomic<std::uint64_t> closed_idle{0};
  std::atomic<std::uint64_t> refused_connection_budget{0};
  std::atomic<std::uint64_t> bytes_received{0};
  std::mutex mutex;
  std::map<std::string, std::uint64_t> errors_by_code;

  void count_error(absl::StatusCode code) {
    answered_error.fetch_add(1);
    std::lock_guard lock(mutex);
    ++errors_by_code[absl::StatusCodeToString(code)];
  }
};

// Resident set size of this process in MiB, from /proc.
double rss_mib() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t pages = 0;
  std::uint64_t resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

// What one request and one connection may take, in bytes and in time.
struct server_limits {
  std::uint32_t max_body = 0;                 // --max_frame_mib
  std::uint64_t budget = 0;                   // --memory_budget_mib
  std::uint64_t connection_budget = 0;        // --connection_budget_mib
  std::chrono::milliseconds read_timeout{0};  // 0: none
  std::chrono::milliseconds idle_timeout{0};  // 0: none
};

class server {
 public:
  server(runtime& rt, device_sum& compute, device target, const server_limits& limits)
      : rt_(rt),
        compute_(compute),
        target_(target),
        limits_(limits),
        budget_(std::make_shared<memory_budget>(limits.budget)) {}

  server_stats& stats() { return stats_; }
  std::shared_ptr<memory_budget> budget() const { return budget_; }

  // One request's body, whichever transport carried it: parse, import,
  // sum (handle, below).
  asio::awaitable<response> answer(std::shared_ptr<std::byte[]> body, std::uint32_t length) {
    return handle(std::move(body), length);
  }
  void count_answer(absl::StatusCode code) {
    if (code == absl::StatusCode::kOk) {
      stats_.answered_ok.fetch_add(1);
    } else {
      stats_.count_error(code);
    }
  }

  asio::awaitable<void> accept_loop(tcp::acceptor& acceptor) {
    for (;;) {
      auto [ec, socket] =
          co_await acceptor.async_accept(asio::make_strand(rt_.get_executor()), as_tuple_awaitable);
      if (ec) break;
      stats_.connections.fetch_add(1);
      auto shared = std::make_shared<tcp::socket>(std::move(socket));
      const std::uint64_t id = track(shared);
      asio::co_spawn(shared->get_executor(), session(shared, id), asio::detached);
    }
  }

  // Closes every connection (on its own strand) and waits until all ended.
  void close_all() {
    std::unique_lock lock(mutex_);
    for (auto& [id, weak] : sessions_) {
      if (auto s = weak.lock()) {
        asio::post(s->get_executor(), [s] {
          asio::error_code ignored;
          s->shutdown(tcp::socket::shutdown_both, ignored);
          s->close(ignored);
        });
      }
    }
    sessions_done_.wait(lock, [&] { return sessions_.empty(); });
  }

 private:
  std::uint64_t track(const std::shared_ptr<tcp::socket>& s) {
    std::lock_guard lock(mutex_);
    sessions_.emplace(++next_session_, s);
    return next_session_;
  }

  void untrack(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    sessions_.erase(id);
    if (sessions_.empty()) sessions_done_.notify_all();
  }

  asio::awaitable<void> session(std::shared_ptr<tcp::socket> socket, std::uint64_t id) {
    co_await serve(*socket);
    asio::error_code ignored;
    socket->close(ignored);
    untrack(id);
  }

  using got = peer_io::got;

  asio::awaitable<bool> reply(peer_io& peer, const response& r) {
    if (r.code == absl::StatusCode::kOk) {
      stats_.answered_ok.fetch_add(1);
    } else {
      stats_.count_error(r.code);
    }
    const got sent = co_await peer.send(r);
    if (sent == got::late) stats_.closed_late.fetch_add(1);
    co_return sent == got::all;
  }

  // Tells a peer past the read deadline why it is disconnected (it sees the
  // response if it still reads); the caller then closes the connection.
  asio::awaitable<void> cut_off(peer_io& peer, const char* what) {
    stats_.closed_late.fetch_add(1);
    stats_.count_error(absl::StatusCode::kDeadlineExceeded);
    const response r{0, absl::StatusCode::kDeadlineExceeded, 0, 0,
                     absl::StrCat(what, " did not arrive within ", peer.read_timeout().count(),
                                  " ms (--read_timeout_ms); closing the connection")};
    co_await peer.send(r);
  }

  // Answers a frame with an error and skips its body; false when the
  // connection ends.
  asio::awaitable<bool> refuse(peer_io& peer, const response& refusal, std::uint64_t body_bytes) {
    const bool sent = co_await reply(peer, refusal);
    if (!sent) co_return false;
    const got skipped = co_await peer.discard(body_bytes);
    if (skipped == got::late) co_await cut_off(peer, "the refused request's body");
    co_return skipped == got::all;
  }

  asio::awaitable<void> serve(tcp::socket& socket) {
    peer_io peer(socket, {limits_.read_timeout, limits_.idle_timeout});
    for (;;) {
      std::array<std::byte, frame_header_bytes> header;
      const got head = co_await peer.read_header(header);
      if (head == got::idle) stats_.closed_idle.fetch_add(1);
      if (head == got::late) co_await cut_off(peer, "a frame header");
      if (head != got::all) co_return;  // closed between frames, or cut off in a header
      absl::StatusOr<std::uint32_t> body_length =
          read_frame_header(header, request_magic, limits_.max_body);
      // GCC 12 mishandles temporaries in co_await expressions inside
      // conditions: each response is a named variable, each co_await its own
      // statement.
      if (!body_length.ok()) {
        const response refusal{0, body_length.status().code(), 0, 0,
                               std::string(body_length.status().message())};
        if (body_length.status().code() != absl::StatusCode::kOutOfRange) {
          stats_.closed_unframed.fetch_add(1);
          co_await reply(peer, refusal);
          co_return;
        }
        // The body length was read: skip the body and go on.
        std::uint32_t skip;
        std::memcpy(&skip, header.data() + 4, sizeof skip);
        const bool goes_on = co_await refuse(peer, refusal, skip);
        if (!goes_on) co_return;
        continue;
      }
      const std::uint32_t length = *body_length;
      // A body larger than the whole budget is refused by acquire, at once.
      const bool within_budget = length <= budget_->limit();
      if (within_budget && length > limits_.connection_budget) {
        stats_.refused_connection_budget.fetch_add(1);
        const response refusal{
            0, absl::StatusCode::kResourceExhausted, 0, 0,
            absl::StrCat("request of ", length, " bytes exceeds the per-connection budget of ",
                         limits_.connection_budget,
                         " bytes (--connection_budget_mib): send smaller tensors")};
        const bool goes_on = co_await refuse(peer, refusal, length);
        if (!goes_on) co_return;
        continue;
      }
      if (within_budget) {
        const got arriving = co_await peer.body_arriving(length);
        if (arriving == got::late) co_await cut_off(peer, "the request's body");
        if (arriving != got::all) co_return;
      }
      const absl::Status granted = co_await acquire(*budget_, length);
      if (!granted.ok()) {
        const response refusal{0, granted.code(), 0, 0,
                               absl::StrCat("request of ", length, " bytes: ", granted.message())};
        const bool goes_on = co_await refuse(peer, refusal, length);
        if (!goes_on) co_return;
        continue;
      }
      // The body returns its bytes to the budget when the last user drops it:
      // this coroutine, or the imported tensor that views it.
      std::shared_ptr<std::byte[]> body(new std::byte[length],
                                        [budget = budget_, bytes = length](std::byte* p) {
                                          delete[] p;
                                          budget->release(bytes);
                                        });
      // The deadline runs from the grant: waiting for room is the server's
      // doing, not the peer's.
      const got read = co_await peer.read(asio::buffer(body.get(), length));
      if (read != got::all) {
        body.reset();  // back to the budget before anything else
        if (read == got::late) co_await cut_off(peer, "the request's body");
        co_return;  // cut off mid-frame, by the peer or the deadline
      }
      stats_.bytes_received.fetch_add(frame_header_bytes + length);
      const response r = co_await handle(std::move(body), length);
      const bool sent = co_await reply(peer, r);
      if (!sent) co_return;
    }
  }

  // The handler proper: parse, import onto the device, sum there.
  asio::awaitable<response> handle(std::shared_ptr<std::byte[]> body, std::uint32_t length) {
    const std::span<const std::byte> bytes(body.get(), length);
    absl::StatusOr<request> req = parse_request(bytes);
    if (!req.ok()) {
      co_return response{peek_request_id(bytes), req.status().code(), 0, 0,
                         std::string(req.status().message())};
    }
    // The payload is imported in place: the tensor keeps the body alive.
    tensor_description d;
    d.data = body.get() + req->payload_offset;
    d.dtype = req->type;
    d.shape = req->shape;
    if (!req->strides.empty()) d.strides = req->strides;
    managed_tensor source = make_managed_tensor(std::move(d), [body = std::move(body)] {});

    import_options options;
    options.target = target_;
    options.require_contiguous = true;
    options.consumer_stream = compute_.stream_for(target_);
    absl::StatusOr<tensor> t = co_await import_dlpack(rt_, source, options);
    if (!t.ok())
      co_return response{req->id, t.status().code(), 0, 0, std::string(t.status().message())};
    absl::StatusOr<double> sum = co_await compute_.sum(*t, options.consumer_stream);
    if (!sum.ok()) {
      co_return response{req->id, sum.status().code(), 0, 0, std::string(sum.status().message())};
    }
    co_return response{req->id, absl::StatusCode::kOk, *sum, t->element_count(), target_.name()};
  }

  runtime& rt_;
  device_sum& compute_;
  const device target_;
  const server_limits limits_;
  std::shared_ptr<memory_budget> budget_;
  server_stats stats_;
  std::mutex mutex_;
  std::condition_variable sessions_done_;
  std::map<std::uint64_t, std::weak_ptr<tcp::socket>> sessions_;
  std::uint64_t next_session_ = 0;
};

// The runtime's counters, in the text the pipeline example prints too.
void print_runtime_stats(const runtime& rt) {
  std::printf("dlasync runtime stats:\n%s\n", to_string(rt.stats()).c_str());
  std::fflush(stdout);
}

int run() {
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
      static_cast<std::uint64_t>(std::max(1, absl::GetFlag(FLAGS_max_frame_mib))) << 20,
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
  server srv(rt, **compute, *target, limits);

  asio::error_code ec;
  tcp::acceptor acceptor(rt.get_executor());
  const tcp::endpoint endpoint(asio::ip::make_address(absl::GetFlag(FLAGS_address), ec),
                               static_cast<unsigned short>(absl::GetFlag(FLAGS_port)));
  if (!ec) acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::fprintf(stderr, "dlasync_server: cannot listen on %s:%d: %s\n",
                 absl::GetFlag(FLAGS_address).c_str(), absl::GetFlag(FLAGS_port),
                 ec.message().c_str());
    return 2;
  }
  const unsigned short port = acceptor.local_endpoint().port();
  std::printf("dlasync server listening on %s:%u, computing on %s\n",
              absl::GetFlag(FLAGS_address).c_str(), port, device_label(rt, *target).c_str());
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_port_file).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_port_file)) << port << "\n";
  }

  std::promise<void> stop;
  std::once_flag stopping;
  auto request_stop = [&] { std::call_once(stopping, [&] { stop.set_value(); }); };
  asio::signal_set signals(rt.get_executor(), SIGINT, SIGTERM);
  signals.async_wait([&](const asio::error_code& e, int) {
    if (!e) request_stop();
  });
  asio::signal_set report(rt.get_executor(), SIGUSR1);
  std::function<void()> report_on_signal = [&] {
    report.async_wait([&](const asio::error_code& e, int) {
      if (e) return;
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
  asio::co_spawn(rt.get_executor(), srv.accept_loop(acceptor), asio::detached);
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
  std::unique_ptr<ucx_front> ucx;
  if (absl::GetFlag(FLAGS_ucx_port) >= 0) {
    ucx_front::options uo;
    uo.address = absl::GetFlag(FLAGS_address);
    uo.port = absl::GetFlag(FLAGS_ucx_port);
    uo.transports = absl::GetFlag(FLAGS_ucx_transports);
    uo.max_body = limits.max_body;
    uo.connection_budget = limits.connection_budget;
    absl::StatusOr<std::unique_ptr<ucx_front>> front = ucx_front::create(
        rt.get_executor(), uo, srv.budget(),
        [&srv](std::shared_ptr<std::byte[]> body, std::uint32_t length) {
          return srv.answer(std::move(body), length);
        },
        [&srv](absl::StatusCode code) { srv.count_answer(code); });
    if (!front.ok()) {
      std::fprintf(stderr, "dlasync_server: %s\n", front.status().ToString().c_str());
      request_stop();
    } else {
      ucx = *std::move(front);
      std::printf("dlasync server listening for UCX on %s:%u\n",
                  absl::GetFlag(FLAGS_address).c_str(), ucx->port());
      std::fflush(stdout);
      if (!absl::GetFlag(FLAGS_ucx_port_file).empty()) {
        std::ofstream(absl::GetFlag(FLAGS_ucx_port_file)) << ucx->port() << "\n";
      }
    }
  }
#else
  if (absl::GetFlag(FLAGS_ucx_port) >= 0) {
    std::fprintf(stderr, "dlasync_server: --ucx_port: this build has no UCX (libucx-dev)\n");
    request_stop();
  }
#endif
  stop.get_future().wait();
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
  if (ucx) {
    ucx->stop();
    std::printf("dlasync server UCX transport: %llu connections, %.1f MiB received\n",
                static_cast<unsigned long long>(ucx->connections()),
                static_cast<double>(ucx->bytes_received()) / (1 << 20));
  }
#endif

  asio::post(rt.get_executor(), [&] {
    asio::error_code ignored;
    acceptor.close(ignored);
    signals.cancel(ignored);
    report.cancel(ignored);
    deadline.cancel();
  });
  srv.close_all();
  rt.shutdown();
  const server_stats& s = srv.stats();
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
  for (const auto& [code, count] : srv.stats().errors_by_code) {
    std::printf("  errors %s: %llu\n", code.c_str(), static_cast<unsigned long long>(count));
  }
  print_runtime_stats(rt);
  return 0;
}

}  // namespace
}  // namespace dlasync::examples

int main(int argc, char** argv) {
  dlasync::examples::parse_flags(
      argc, argv,
      "Serves tensor requests over TCP: imports each received tensor onto the device with "
      "dlasync and replies with the sum of its elements.\n\n"
      "  dlasync_server [--port=5555] [--device=auto|cpu|cuda:N] [--sim_gpus=N] ...");
  return dlasync::examples::run();
}
