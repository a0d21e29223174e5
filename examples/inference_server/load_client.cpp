// dlasync_load: a load generator for dlasync_server.
//
// Opens N connections and, for a given time, sends requests on each one
// after the other: random dtypes, shapes and layouts (compact, transposed,
// row-sliced, broadcast) with known sums, checked against every reply. With
// --malformed, a share of the frames are broken on purpose (unknown dtype,
// payload that does not match the shape, absurd extents, ndim too large,
// shape and strides cut short, a body over the server's limit, a wrong magic,
// a frame cut off by closing the connection); each must get the specific
// error it deserves, and the connection must go on working (a wrong magic or
// a cut frame costs the connection, as the protocol says, and the client
// reconnects). With --slow_peers, some connections announce a body and
// send it a byte at a time: the server must disconnect them at its read
// deadline while the other connections, opened after them, are answered.
//
// Prints throughput, latency percentiles of the valid requests and the
// outcome counts; exits 0 only when every reply was the one expected.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "asio/co_spawn.hpp"
#include "asio/connect.hpp"
#include "asio/executor_work_guard.hpp"
#include "asio/experimental/as_tuple.hpp"
#include "asio/io_context.hpp"
#include "asio/ip/tcp.hpp"
#include "asio/read.hpp"
#include "asio/steady_timer.hpp"
#include "asio/strand.hpp"
#include "asio/use_future.hpp"
#include "asio/write.hpp"
#include "common/flags.hpp"
#include "common/stats.hpp"
#include "frame.hpp"
#include "load_kserve.hpp"
#include "slow_peer.hpp"
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
#include "ucx_client.hpp"
#include "ucx_hostile_peers.hpp"
#endif

ABSL_FLAG(std::string, host, "127.0.0.1", "Server address.");
ABSL_FLAG(int, port, 5555, "Server port.");
ABSL_FLAG(int, connections, 8, "Connections, each sending requests one after the other.");
ABSL_FLAG(double, seconds, 5, "How long to send.");
ABSL_FLAG(int, max_elements, 65536, "Largest tensor, in elements.");
ABSL_FLAG(double, malformed, 0, "Share of frames (0 to 1) that are malformed on purpose.");
ABSL_FLAG(int, server_max_frame_mib, 0,
          "The server's --max_frame_mib; when set, some malformed frames exceed it (their "
          "bodies are sent in full, so keep it small).");
ABSL_FLAG(int, server_budget_mib, 0,
          "The server's --memory_budget_mib, when below its frame limit: adds frames larger "
          "than the budget, which must be refused with ResourceExhausted.");
ABSL_FLAG(int, server_connection_budget_mib, 0,
          "The server's --connection_budget_mib, when below its frame limit and its memory "
          "budget: adds frames larger than one connection may hold, which must be refused with "
          "ResourceExhausted.");
ABSL_FLAG(int, slow_peers, 0,
          "Extra connections, opened first, that announce a body of --slow_body_kib and send it "
          "a byte every --slow_interval_ms; the server must disconnect each of them within "
          "--slow_seconds.");
ABSL_FLAG(int, slow_body_kib, 1024, "The body a slow peer announces, in KiB.");
ABSL_FLAG(int, slow_interval_ms, 100, "Time between two bytes of a slow peer.");
ABSL_FLAG(double, slow_seconds, 10, "How long a slow peer may stay connected.");
ABSL_FLAG(std::uint32_t, seed, 1, "Random seed.");
ABSL_FLAG(std::string, transport, "tcp",
          "tcp: the server's TCP frames (--port). The KServe v2 transports, with requests to the "
          "`sum` model: rest (HTTP/1.1 with binary tensor data, --http_port), grpc "
          "(--grpc_port), ucx (the gRPC messages as UCX active messages, --ucx_port; needs "
          "dlasync built with UCX).");
ABSL_FLAG(int, http_port, 8000, "The server's HTTP port (--transport=rest).");
ABSL_FLAG(int, grpc_port, 8001, "The server's gRPC port (--transport=grpc).");
ABSL_FLAG(int, ucx_port, 5556, "The server's UCX port (--transport=ucx).");
ABSL_FLAG(std::string, ucx_transports, "",
          "UCX transports (UCX_TLS's syntax; empty: UCX's choice), --transport=ucx.");
ABSL_FLAG(int, threads, 2, "Client threads.");

namespace dlasync::examples {
namespace {

using asio::ip::tcp;
constexpr auto as_tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

// A valid request with the sum the server must answer.
struct valid_request {
  std::vector<std::byte> frame;
  double sum = 0;
  std::int64_t count = 0;
};

template <typename T>
void fill(std::vector<std::byte>& payload, std::size_t elements, std::mt19937& rng) {
  payload.resize(elements * sizeof(T));
  std::uniform_int_distribution<int> value(-100, 100);
  for (std::size_t i = 0; i < elements; ++i) {
    T v = static_cast<T>(std::is_unsigned_v<T> ? value(rng) + 100 : value(rng));
    std::memcpy(payload.data() + i * sizeof(T), &v, sizeof v);
  }
}

// The sum of the logical elements (what the server sums after compaction).
template <typename T>
double logical_sum(const std::vector<std::byte>& payload, std::span<const std::int64_t> shape,
                   std::span<const std::int64_t> strides) {
  std::int64_t count = 1;
  for (std::int64_t e : shape) count *= e;
  double sum = 0;
  std::vector<std::int64_t> index(shape.size(), 0);
  for (std::int64_t n = 0; n < count; ++n) {
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) offset += index[d] * strides[d];
    T v;
    std::memcpy(&v, payload.data() + static_cast<std::size_t>(offset) * sizeof(T), sizeof v);
    sum += static_cast<double>(v);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return sum;
}

valid_request make_valid(std::uint64_t id, std::mt19937& rng, int max_elements) {
  static constexpr dtype types[] = {dtypes::float32, dtypes::float64, dtypes::int32, dtypes::int64,
                                    dtypes::uint8};
  const dtype type = types[rng() % 5];
  std::uniform_int_distribution<std::int64_t> side(1, 64);
  std::vector<std::int64_t> shape;
  const int ndim = 1 + static_cast<int>(rng() % 3);
  std::int64_t count = 1;
  for (int d = 0; d < ndim; ++d) {
    std::int64_t e = side(rng);
    while (count * e > max_elements && e > 1) e /= 2;
    shape.push_back(e);
    count *= e;
  }
  // Layout: 0 compact, 1 reversed axis order (transposed), 2 every other
  // element of the last axis, 3 broadcast along the first axis.
  std::vector<std::int64_t> strides(static_cast<std::size_t>(ndim));
  const int layout = static_cast<int>(rng() % 4);
  std::int64_t step = layout == 2 ? 2 : 1;
  if (layout == 1) {
    for (int d = 0; d < ndim; ++d) {
      strides[static_cast<std::size_t>(d)] = step;
      step *= shape[static_cast<std::size_t>(d)];
    }
  } else {
    for (int d = ndim; d-- > 0;) {
      strides[static_cast<std::size_t>(d)] = step;
      step *= shape[static_cast<std::size_t>(d)];
    }
    if (layout == 3) strides[0] = 0;
  }
  const std::uint64_t bytes = *payload_bytes_for(type, shape, strides);
  const std::size_t elements = static_cast<std::size_t>(bytes / type.padded_size());
  std::vector<std::byte> payload;
  double sum = 0;
  if (type == dtypes::float32) {
    fill<float>(payload, elements, rng);
    sum = logical_sum<float>(payload, shape, strides);
  } else if (type == dtypes::float64) {
    fill<double>(payload, elements, rng);
    sum = logical_sum<double>(payload, shape, strides);
  } else if (type == dtypes::int32) {
    fill<std::int32_t>(payload, elements, rng);
    sum = logical_sum<std::int32_t>(payload, shape, strides);
  } else if (type == dtypes::int64) {
    fill<std::int64_t>(payload, elements, rng);
    sum = logical_sum<std::int64_t>(payload, shape, strides);
  } else {
    fill<std::uint8_t>(payload, elements, rng);
    sum = logical_sum<std::uint8_t>(payload, shape, strides);
  }
  return {encode_request(id, type, shape, strides, payload), sum, count};
}

// Malformed frames. The framed ones get an error response and the
// connection goes on; the unframed ones end the connection.
enum class malformed_kind {
  unknown_dtype,     // InvalidArgument
  payload_mismatch,  // InvalidArgument
  absurd_extents,    // OutOfRange
  ndim_too_large,    // InvalidArgument
  dims_cut_short,    // InvalidArgument
  oversized,         // OutOfRange (only with --server_max_frame_mib)
  wrong_magic,       // InvalidArgument, then the server closes
  cut_off,           // the client closes mid-frame: no response
  over_budget,       // ResourceExhausted (only with --server_budget_mib below the frame limit)
  over_connection_budget,  // ResourceExhausted (only with --server_connection_budget_mib)
};
constexpr int malformed_kinds = 10;

struct malformed_request {
  malformed_kind kind;
  std::vector<std::byte> frame;
  absl::StatusCode expected = absl::StatusCode::kInvalidArgument;
  std::string expected_word;
};

void set_u32(std::vector<std::byte>& frame, std::size_t at, std::uint32_t v) {
  std::memcpy(frame.data() + at, &v, sizeof v);
}

malformed_request make_malformed(std::uint64_t id, std::mt19937& rng, const server_limits& server) {
  const std::uint32_t server_max = server.max_frame;
  const std::uint32_t server_budget = server.budget;
  const std::uint32_t connection_budget = server.connection_budget;
  malformed_request m;
  m.kind = static_cast<malformed_kind>(rng() % malformed_kinds);
  if (m.kind == malformed_kind::oversized && server_max == 0)
    m.kind = malformed_kind::unknown_dtype;
  if (m.kind == malformed_kind::over_budget && (server_budget == 0 || server_budget >= server_max))
    m.kind = malformed_kind::payload_mismatch;
  if (m.kind == malformed_kind::over_connection_budget &&
      (connection_budget == 0 || connection_budget >= server_max ||
       (server_budget != 0 && connection_budget >= server_budget)))
    m.kind = malformed_kind::ndim_too_large;
  const std::vector<std::int64_t> shape{4, 8};
  const std::vector<std::int64_t> strides{8, 1};
  const std::vector<std::byte> payload(std::size_t{32} * 4, std::byte{1});
  switch (m.kind) {
    case malformed_kind::unknown_dtype:
      m.frame = encode_request(id, dtype{99, 32, 1}, shape, strides, payload);
      m.expected_word = "dtype";
      break;
    case malformed_kind::payload_mismatch:
      m.frame = encode_request(id, dtypes::float32, shape, strides,
                               std::span(payload).first(payload.size() - 4));
      m.expected_word = "does not match";
      break;
    case malformed_kind::absurd_extents: {
      const std::vector<std::int64_t> huge{std::int64_t{1} << 40, std::int64_t{1} << 40};
      const std::vector<std::int64_t> huge_strides{std::int64_t{1} << 40, 1};
      m.frame = encode_request(id, dtypes::float32, huge, huge_strides, {});
      m.expected = absl::StatusCode::kOutOfRange;
      m.expected_word = "overflows";
      break;
    }
    case malformed_kind::ndim_too_large: {
      const std::vector<std::int64_t> many(max_frame_ndim + 1, 1);
      m.frame = encode_request(id, dtypes::float32, many, many, std::span(payload).first(4));
      m.expected_word = "ndim";
      break;
    }
    case malformed_kind::dims_cut_short:
      // A body that ends inside the strides.
      m.frame = encode_request(id, dtypes::float32, shape, strides, {});
      m.frame.resize(m.frame.size() - 12);
      set_u32(m.frame, 4, static_cast<std::uint32_t>(m.frame.size() - frame_header_bytes));
      m.expected_word = "no room";
      break;
    case malformed_kind::oversized:
      m.frame.assign(frame_header_bytes + server_max + 1, std::byte{0});
      set_u32(m.frame, 0, request_magic);
      set_u32(m.frame, 4, server_max + 1);
      m.expected = absl::StatusCode::kOutOfRange;
      m.expected_word = "exceeds";
      break;
    case malformed_kind::wrong_magic:
      m.frame = encode_request(id, dtypes::float32, shape, strides, payload);
      set_u32(m.frame, 0, 0x50545448);  // "HTTP"
      m.expected_word = "magic";
      break;
    case malformed_kind::cut_off:
      m.frame = encode_request(id, dtypes::float32, shape, strides, payload);
      m.frame.resize(m.frame.size() / 2);
      break;
    case malformed_kind::over_budget:
      // Within the frame limit, beyond the whole memory budget: refused
      // before the body is read, which the server then skips.
      m.frame.assign(frame_header_bytes + server_budget + 1, std::byte{0});
      set_u32(m.frame, 0, request_magic);
      set_u32(m.frame, 4, server_budget + 1);
      m.expected = absl::StatusCode::kResourceExhausted;
      m.expected_word = "exceeds the whole";
      break;
    case malformed_kind::over_connection_budget:
      // Within the frame limit and the whole budget, beyond one connection's
      // share: refused before the body is read, which the server then skips.
      m.frame.assign(frame_header_bytes + connection_budget + 1, std::byte{0});
      set_u32(m.frame, 0, request_magic);
      set_u32(m.frame, 4, connection_budget + 1);
      m.expected = absl::StatusCode::kResourceExhausted;
      m.expected_word = "per-connection";
      break;
  }
  return m;
}

// Counts a valid request's answer, or reports how it is wrong.
void check_answer(load_stats& stats, const char* transport, std::uint64_t id,
                  const valid_request& v, const response& r) {
  if (r.id != id || r.code != absl::StatusCode::kOk || r.sum != v.sum || r.count != v.count) {
    stats.problem(absl::StrCat(transport, "request ", id, ": got id ", r.id, " ",
                               absl::StatusCodeToString(r.code), " sum ", r.sum, " count ", r.count,
                               " (", r.text, "), expected sum ", v.sum, " count ", v.count));
  } else {
    stats.valid_ok.fetch_add(1);
  }
}

// Counts a malformed request's refusal when it is the one it deserves, or
// reports it; true when it was.
bool check_refusal(load_stats& stats, const char* transport, const malformed_request& m,
                   const absl::StatusOr<response>& r) {
  if (!r.ok() || r->code != m.expected || r->text.find(m.expected_word) == std::string::npos) {
    stats.problem(
        absl::StrCat(transport, "malformed frame kind ", static_cast<int>(m.kind), ": expected ",
                     absl::StatusCodeToString(m.expected), " \"", m.expected_word, "\", got ",
                     r.ok() ? absl::StrCat(absl::StatusCodeToString(r->code), " ", r->text)
                            : r.status().ToString()));
    return false;
  }
  stats.malformed_answered.fetch_add(1);
  return true;
}

asio::awaitable<absl::StatusOr<response>> read_response(tcp::socket& socket) {
  std::array<std::byte, frame_header_bytes> header;
  auto [ec, n] = co_await asio::async_read(socket, asio::buffer(header), as_tuple_awaitable);
  if (ec) co_return absl::UnavailableError(absl::StrCat("no response: ", ec.message()));
  absl::StatusOr<std::uint32_t> length = read_frame_header(header, response_magic, 1 << 20);
  if (!length.ok()) co_return length.status();
  std::vector<std::byte> body(*length);
  auto [ec2, m] = co_await asio::async_read(socket, asio::buffer(body), as_tuple_awaitable);
  if (ec2) co_return absl::UnavailableError(absl::StrCat("response cut off: ", ec2.message()));
  co_return parse_response(body);
}

asio::awaitable<bool> connect(tcp::socket& socket, const tcp::endpoint& server) {
  asio::error_code ignored;
  socket.close(ignored);
  auto [ec] = co_await socket.async_connect(server, as_tuple_awaitable);
  co_return !ec;
}

std::uint32_t mib_flag(const absl::Flag<int>& flag) {
  return static_cast<std::uint32_t>(std::max(0, absl::GetFlag(flag))) << 20;
}

asio::awaitable<void> drive(int index, tcp::endpoint server, clock::time_point stop_at,
                            load_stats& stats, const slow_peer_stats& slow) {
  std::mt19937 rng(absl::GetFlag(FLAGS_seed) * 1000003u + static_cast<unsigned>(index));
  std::bernoulli_distribution malformed(absl::GetFlag(FLAGS_malformed));
  const server_limits limits{mib_flag(FLAGS_server_max_frame_mib),
                             mib_flag(FLAGS_server_budget_mib),
                             mib_flag(FLAGS_server_connection_budget_mib)};
  // Connect once the slow peers hold their room (waiting 2 s at most).
  asio::steady_timer pause(co_await asio::this_coro::executor);
  for (int i = 0; i < 200 && slow.started.load() < absl::GetFlag(FLAGS_slow_peers); ++i) {
    pause.expires_after(std::chrono::milliseconds(10));
    co_await pause.async_wait(as_tuple_awaitable);
  }
  tcp::socket socket(co_await asio::this_coro::executor);
  if (const bool up = co_await connect(socket, server); !up) {
    stats.problem(absl::StrCat("connection ", index, ": cannot connect"));
    co_return;
  }
  std::uint64_t id = static_cast<std::uint64_t>(index) << 40;
  while (clock::now() < stop_at) {
    ++id;
    if (malformed(rng)) {
      malformed_request m = make_malformed(id, rng, limits);
      auto [ec, n] = co_await asio::async_write(socket, asio::buffer(m.frame), as_tuple_awaitable);
      stats.bytes_sent.fetch_add(n);
      if (m.kind == malformed_kind::cut_off || ec) {
        stats.malformed_answered.fetch_add(m.kind == malformed_kind::cut_off ? 1 : 0);
        stats.reconnects.fetch_add(1);
        if (const bool up = co_await connect(socket, server); !up) {
          stats.problem("cannot reconnect after a cut-off frame");
          co_return;
        }
        continue;
      }
      absl::StatusOr<response> r = co_await read_response(socket);
      check_refusal(stats, "", m, r);
      if (m.kind == malformed_kind::wrong_magic) {
        stats.reconnects.fetch_add(1);
        if (const bool up = co_await connect(socket, server); !up) {
          stats.problem("cannot reconnect after a wrong magic");
          co_return;
        }
      }
      continue;
    }
    valid_request v = make_valid(id, rng, absl::GetFlag(FLAGS_max_elements));
    const clock::time_point start = clock::now();
    auto [ec, n] = co_await asio::async_write(socket, asio::buffer(v.frame), as_tuple_awaitable);
    if (ec) {
      stats.problem(absl::StrCat("send failed: ", ec.message()));
      co_return;
    }
    stats.bytes_sent.fetch_add(n);
    absl::StatusOr<response> r = co_await read_response(socket);
    if (!r.ok()) {
      stats.problem(absl::StrCat("request ", id, ": ", r.status().ToString()));
      co_return;
    }
    stats.latency.add(clock::now() - start);
    check_answer(stats, "", id, v, *r);
  }
}

int run() {
  asio::io_context io;
  asio::error_code ec;
  const tcp::endpoint server(asio::ip::make_address(absl::GetFlag(FLAGS_host), ec),
                             static_cast<unsigned short>(absl::GetFlag(FLAGS_port)));
  if (ec) {
    std::fprintf(stderr, "dlasync_load: --host=%s: %s\n", absl::GetFlag(FLAGS_host).c_str(),
                 ec.message().c_str());
    return 2;
  }
  load_stats stats;
  const clock::time_point start = clock::now();
  const clock::time_point stop_at =
      start + std::chrono::duration_cast<clock::duration>(
                  std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
  std::vector<std::future<void>> done;
  slow_peer_stats slow;
  slow_peer_options slow_options;
  slow_options.announced_bytes =
      static_cast<std::uint32_t>(std::max(1, absl::GetFlag(FLAGS_slow_body_kib))) << 10;
  slow_options.interval = std::chrono::milliseconds(absl::GetFlag(FLAGS_slow_interval_ms));
  slow_options.give_up_after = std::chrono::milliseconds(
      static_cast<std::int64_t>(absl::GetFlag(FLAGS_slow_seconds) * 1000));
  done.reserve(static_cast<std::size_t>(std::max(0, absl::GetFlag(FLAGS_slow_peers))));
  for (int i = 0; i < absl::GetFlag(FLAGS_slow_peers); ++i) {
    done.push_back(asio::co_spawn(asio::make_strand(io), slow_peer(server, slow_options, slow),
                                  asio::use_future));
  }
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "tcp" && transport != "rest" && transport != "grpc" && transport != "ucx") {
    std::fprintf(stderr, "dlasync_load: --transport=%s: tcp, rest, grpc or ucx\n",
                 transport.c_str());
    return 2;
  }
  if (transport == "tcp") {
    for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_connections)); ++i) {
      done.push_back(asio::co_spawn(io, drive(i, server, stop_at, stats, slow), asio::use_future));
    }
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_threads)); ++i) {
    threads.emplace_back([&io] { io.run(); });
  }
  kserve_load load;
  load.host = absl::GetFlag(FLAGS_host);
  load.connections = absl::GetFlag(FLAGS_connections);
  load.stop_at = stop_at;
  load.max_elements = absl::GetFlag(FLAGS_max_elements);
  load.malformed = absl::GetFlag(FLAGS_malformed);
  load.seed = absl::GetFlag(FLAGS_seed);
  load.server = {mib_flag(FLAGS_server_max_frame_mib), mib_flag(FLAGS_server_budget_mib),
                 mib_flag(FLAGS_server_connection_budget_mib)};
  load.threads = absl::GetFlag(FLAGS_threads);
  bool hostile = false;  // a misbehaving peer, which sends no load
  if (transport == "rest") {
    load.port = absl::GetFlag(FLAGS_http_port);
    run_rest(load, stats);
  } else if (transport == "grpc") {
    load.port = absl::GetFlag(FLAGS_grpc_port);
    run_grpc(load, stats);
  } else if (transport == "ucx") {
    load.port = absl::GetFlag(FLAGS_ucx_port);
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
    if (ucx_hostile_requested()) {
      hostile = true;
      asio::io_context ucx_io;
      std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work(
          ucx_io.get_executor());
      std::thread progress([&ucx_io] { ucx_io.run(); });
      absl::StatusOr<std::unique_ptr<ucx_client>> client =
          ucx_client::create(ucx_io.get_executor(), absl::GetFlag(FLAGS_ucx_transports));
      if (!client.ok()) {
        stats.problem(client.status().ToString());
      } else {
        const ucx_peer_target target{load.host, load.port};
        for (std::string& p : run_ucx_hostile(**client, target)) stats.problem(std::move(p));
        (*client)->stop();
      }
      work.reset();
      progress.join();
    } else {
      run_ucx(load, absl::GetFlag(FLAGS_ucx_transports), stats);
    }
#else
    run_ucx(load, absl::GetFlag(FLAGS_ucx_transports), stats);
#endif
  }
  for (std::thread& t : threads) t.join();
  for (std::future<void>& f : done) f.get();
  const double seconds = std::chrono::duration<double>(clock::now() - start).count();

  std::printf("dlasync load: %d connections over %s, %.1f s\n", absl::GetFlag(FLAGS_connections),
              absl::GetFlag(FLAGS_transport).c_str(), seconds);
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
  if (absl::GetFlag(FLAGS_slow_peers) > 0) {
    std::sort(slow.disconnected_after_ms.begin(), slow.disconnected_after_ms.end());
    std::printf(
        "  slow peers disconnected by the server: %d of %d (after %.0f to %.0f ms; %d told "
        "DeadlineExceeded)\n",
        slow.disconnected.load(), absl::GetFlag(FLAGS_slow_peers),
        slow.disconnected_after_ms.empty() ? 0.0 : slow.disconnected_after_ms.front(),
        slow.disconnected_after_ms.empty() ? 0.0 : slow.disconnected_after_ms.back(),
        slow.told_deadline.load());
    for (std::string& p : slow.problems) stats.problem(std::move(p));
  }
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
      "Drives dlasync_server with N connections for a given time, checks every reply, and "
      "prints throughput and latency percentiles.\n\n"
      "  dlasync_load [--port=5555] [--connections=8] [--seconds=5] [--malformed=0.2] ...");
  return dlasync::examples::run();
}
