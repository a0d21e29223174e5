#include "load_kserve.hpp"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "asio/co_spawn.hpp"
#include "asio/experimental/as_tuple.hpp"
#include "asio/io_context.hpp"
#include "asio/ip/tcp.hpp"
#include "asio/use_future.hpp"
#include "grpc_service.grpc.pb.h"
#include "http_client.hpp"
#include "kserve_requests.hpp"
#include "nlohmann/json.hpp"
#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
#include "absl/strings/escaping.h"
#include "asio/executor_work_guard.hpp"
#include "dlasync/producer.hpp"
#include "dlasync/remote.hpp"
#include "kserve.hpp"
#include "ucx_client.hpp"
#include "ucx_protocol.hpp"
#endif

namespace dlasync::examples {
namespace {

using json = nlohmann::json;
using asio::ip::tcp;
constexpr auto as_tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);

// What is wrong with a request on purpose. The first five are the same
// mistake over every transport; the rest take a transport's own form.
enum class fault {
  none,
  unknown_model,      // NotFound: a model not served
  wrong_datatype,     // InvalidArgument: INT32 for INPUT0's FP32
  contents_mismatch,  // InvalidArgument: 124 bytes for a shape that takes 128
  unknown_input,      // InvalidArgument: INPUT9
  absurd_shape,       // InvalidArgument: a size that overflows 64 bits
  not_a_request,      // REST: not JSON; UCX: not a ModelInferRequest; gRPC: as unknown_model
  framing,            // REST: a JSON length past the body; UCX: a wrong magic; gRPC: as above
  oversized,          // past --max_request_mib
  over_budget,        // past the whole memory budget (and within the request limit)
  over_connection,    // past one connection's share (REST and UCX)
};
constexpr int fault_kinds = 10;

// One request to send: a `sum` request of `values` (or what its fault
// makes of it), with what must come back.
struct sum_case {
  fault kind = fault::none;
  std::uint64_t tag = 0;
  std::string model = "sum";
  std::string input = "INPUT0";
  std::string datatype = "FP32";
  std::vector<std::int64_t> shape;
  std::vector<float> values;
  std::size_t content_bytes = 0;  // of the values' bytes, sent
  std::size_t filler = 0;         // oversized kinds: the bytes of the whole request
  double sum = 0;
  absl::StatusCode expected = absl::StatusCode::kOk;
  std::string word;  // in the refusal's message
};

enum class front { rest, grpc, ucx };

// Connection `index`'s requests: its own seeded stream, and tags that no
// other connection's reach.
std::mt19937 connection_rng(const kserve_load& load, int index) {
  return std::mt19937(load.seed * 1000003u + static_cast<unsigned>(index));
}
std::uint64_t first_tag(int index) {
  return static_cast<std::uint64_t>(index) << 40;
}

sum_case make_case(std::uint64_t tag, std::mt19937& rng, const kserve_load& load, front over) {
  const bool grpc_front = over == front::grpc;
  sum_case c;
  c.tag = tag;
  std::bernoulli_distribution malformed(load.malformed);
  if (!malformed(rng)) {
    std::uniform_int_distribution<int> count(1, std::max(1, load.max_elements));
    std::uniform_int_distribution<int> value(-100, 100);
    c.values.resize(static_cast<std::size_t>(count(rng)));
    // Integers of -100 to 100: a double holds their sum exactly.
    for (float& x : c.values) {
      x = static_cast<float>(value(rng));
      c.sum += x;
    }
    c.shape = {static_cast<std::int64_t>(c.values.size())};
    c.content_bytes = c.values.size() * sizeof(float);
    return c;
  }
  const server_limits_given& server = load.server;
  c.kind = static_cast<fault>(1 + rng() % fault_kinds);
  if (grpc_front && (c.kind == fault::not_a_request || c.kind == fault::framing ||
                     c.kind == fault::over_connection)) {
    c.kind = fault::unknown_model;  // gRPC frames its own messages, and has no such share
  }
  if (c.kind == fault::oversized && server.max_request == 0) c.kind = fault::wrong_datatype;
  if (c.kind == fault::over_budget && (server.budget == 0 || server.budget >= server.max_request)) {
    c.kind = fault::contents_mismatch;
  }
  if (c.kind == fault::over_connection &&
      (server.connection_budget == 0 || server.connection_budget >= server.max_request ||
       (server.budget != 0 && server.connection_budget >= server.budget))) {
    c.kind = fault::unknown_input;
  }
  c.values.assign(32, 1.0F);
  c.shape = {32};
  c.content_bytes = 128;
  c.expected = absl::StatusCode::kInvalidArgument;
  switch (c.kind) {
    case fault::none: break;
    case fault::unknown_model:
      c.model = "no_such_model";
      c.expected = absl::StatusCode::kNotFound;
      c.word = "not served here";
      break;
    case fault::wrong_datatype:
      c.datatype = "INT32";
      c.word = "the request sends INT32";
      break;
    case fault::contents_mismatch:
      c.content_bytes = 124;
      c.word = "takes 128";
      break;
    case fault::unknown_input:
      c.input = "INPUT9";
      c.word = "has no input";
      break;
    case fault::absurd_shape:
      c.shape = {std::int64_t{1} << 40, std::int64_t{1} << 40};
      c.content_bytes = 0;
      c.word = "overflows";
      break;
    case fault::not_a_request:
      c.word = over == front::rest ? "is not JSON" : "not a ModelInferRequest";
      break;
    case fault::framing: c.word = over == front::rest ? "past the body" : "magic"; break;
    case fault::oversized:
      c.filler = std::size_t{server.max_request} + 1;
      // gRPC's own limit, the REST front's 413, the UCX transport's.
      c.expected =
          over == front::ucx ? absl::StatusCode::kOutOfRange : absl::StatusCode::kResourceExhausted;
      c.word = over == front::grpc   ? "larger than max"
               : over == front::rest ? "over the server's limit"
                                     : "exceeds the limit";
      break;
    case fault::over_budget:
      c.filler = std::size_t{server.budget} + 1;
      c.expected = absl::StatusCode::kResourceExhausted;
      c.word = "exceeds the whole";
      break;
    case fault::over_connection:
      c.filler = std::size_t{server.connection_budget} + 1;
      c.expected = absl::StatusCode::kResourceExhausted;
      c.word = "per-connection";
      break;
  }
  return c;
}

// The case as a gRPC message (gRPC and UCX).
inference::ModelInferRequest to_message(const sum_case& c) {
  inference::ModelInferRequest r = kserve::sum_request(std::to_string(c.tag), c.values);
  r.set_model_name(c.model);
  auto* in = r.mutable_inputs(0);
  in->set_name(c.input);
  in->set_datatype(c.datatype);
  in->clear_shape();
  for (std::int64_t e : c.shape) in->add_shape(e);
  // Oversized kinds: a message of `filler` bytes, the contents padding it
  // (its errors come before the contents are looked at).
  r.mutable_raw_input_contents(0)->resize(c.filler > 0 ? c.filler : c.content_bytes);
  return r;
}

// Counts the answer to `c` (code, and a sum or an error's text), or
// reports how it is wrong.
void count(load_stats& stats, const char* transport, const sum_case& c, absl::StatusCode code,
           const absl::StatusOr<double>& sum, absl::string_view error_text) {
  if (c.kind == fault::none) {
    if (code == absl::StatusCode::kOk && sum.ok() && *sum == c.sum) {
      stats.valid_ok.fetch_add(1);
      return;
    }
    stats.problem(absl::StrCat(transport, " request ", c.tag, ": ",
                               code != absl::StatusCode::kOk
                                   ? absl::StrCat(absl::StatusCodeToString(code), " ", error_text)
                               : sum.ok() ? absl::StrCat("sum ", *sum)
                                          : sum.status().ToString(),
                               "; expected sum ", c.sum));
    return;
  }
  if (code == c.expected && error_text.find(c.word) != absl::string_view::npos) {
    stats.malformed_answered.fetch_add(1);
    return;
  }
  stats.problem(absl::StrCat(transport, " malformed request kind ", static_cast<int>(c.kind),
                             ": expected ", absl::StatusCodeToString(c.expected), " \"", c.word,
                             "\", got ", absl::StatusCodeToString(code), " ", error_text));
}

// ---- REST ----

// The HTTP status the REST front gives a code (http_front's mapping).
absl::StatusCode code_of_http(int status) {
  switch (status) {
    case 200: return absl::StatusCode::kOk;
    case 400: return absl::StatusCode::kInvalidArgument;
    case 404: return absl::StatusCode::kNotFound;
    case 413: return absl::StatusCode::kResourceExhausted;
    case 408: return absl::StatusCode::kDeadlineExceeded;
    case 429:
    case 503: return absl::StatusCode::kUnavailable;
    default: return absl::StatusCode::kUnknown;
  }
}

// The request's bytes, and whether the server closes the connection after
// answering (a refusal that leaves the body unread).
struct rest_request {
  std::string bytes;
  bool closes = false;
};

rest_request to_rest(const sum_case& c, const std::string& host) {
  const std::string target = absl::StrCat("/v2/models/", c.model, "/infer");
  json shape = json::array();
  for (std::int64_t e : c.shape) shape.push_back(e);
  json header = {{"id", std::to_string(c.tag)},
                 {"inputs",
                  {{{"name", c.input},
                    {"shape", shape},
                    {"datatype", c.datatype},
                    {"parameters", {{"binary_data_size", c.content_bytes}}}}}},
                 {"outputs", {{{"name", "SUM"}, {"parameters", {{"binary_data", true}}}}}}};
  const std::string text = c.kind == fault::not_a_request ? "{\"inputs\": [1, 2" : header.dump();
  std::size_t header_length = text.size();
  if (c.kind == fault::framing) header_length += c.content_bytes + 1;  // past the body
  rest_request r;
  if (c.filler > 0) {
    // Only the head: the server refuses before it reads a body, and closes.
    r.bytes = absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: ", host,
                           "\r\nContent-Length: ", c.filler, "\r\n\r\n");
    r.closes = true;
    return r;
  }
  const auto* json_bytes = reinterpret_cast<const std::byte*>(text.data());
  const auto* values = reinterpret_cast<const std::byte*>(c.values.data());
  r.bytes =
      http_post(target, absl::StrCat("Inference-Header-Content-Length: ", header_length, "\r\n"),
                host, std::span(json_bytes, text.size()),
                std::span(values, std::min(c.content_bytes, c.values.size() * 4)));
  return r;
}

// The SUM of a REST answer: JSON, then 8 bytes of binary data.
absl::StatusOr<double> rest_sum(const http_response& r, const sum_case& c) {
  const std::optional<absl::string_view> length = r.header("inference-header-content-length");
  std::size_t json_length = 0;
  if (!length || !absl::SimpleAtoi(*length, &json_length) || json_length > r.body.size()) {
    return absl::InvalidArgumentError("an answer without a valid Inference-Header-Content-Length");
  }
  const json j = json::parse(r.body.begin(), r.body.begin() + static_cast<long>(json_length),
                             nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("id") || j["id"] != std::to_string(c.tag) ||
      !j.contains("outputs") || j["outputs"].size() != 1 || j["outputs"][0]["name"] != "SUM" ||
      j["outputs"][0]["datatype"] != "FP64" || r.body.size() - json_length != sizeof(double)) {
    return absl::InvalidArgumentError(
        absl::StrCat("an answer that is not this request's SUM: ", r.body.substr(0, json_length)));
  }
  double sum = 0;
  std::memcpy(&sum, r.body.data() + json_length, sizeof sum);
  return sum;
}

asio::awaitable<void> drive_rest(int index, const kserve_load& load, tcp::endpoint server,
                                 load_stats& stats) {
  std::mt19937 rng = connection_rng(load, index);
  const std::string host = absl::StrCat(load.host, ":", load.port);
  std::optional<tcp::socket> socket;
  std::optional<http_client> client;
  auto connect = [&]() -> asio::awaitable<bool> {
    client.reset();
    socket.emplace(co_await asio::this_coro::executor);
    auto [ec] = co_await socket->async_connect(server, as_tuple_awaitable);
    if (ec) co_return false;
    socket->set_option(tcp::no_delay(true));
    client.emplace(*socket);
    co_return true;
  };
  if (const bool up = co_await connect(); !up) {
    stats.problem(absl::StrCat("REST connection ", index, ": cannot connect"));
    co_return;
  }
  std::uint64_t tag = first_tag(index);
  while (clock::now() < load.stop_at) {
    const sum_case c = make_case(++tag, rng, load, front::rest);
    const rest_request request = to_rest(c, host);
    const clock::time_point start = clock::now();
    stats.bytes_sent.fetch_add(request.bytes.size());
    const absl::Status sent = co_await client->send(std::as_bytes(std::span(request.bytes)));
    // (Not a conditional expression: GCC 12 destroys a co_await's result in
    // one twice.)
    absl::StatusOr<http_response> r = absl::UnknownError("unanswered");
    if (sent.ok()) {
      r = co_await client->receive();
    } else {
      r = sent;
    }
    if (!r.ok()) {
      stats.problem(absl::StrCat("REST request ", c.tag, ": ", r.status().ToString()));
      co_return;
    }
    if (c.kind == fault::none) stats.latency.add(clock::now() - start);
    const absl::StatusCode code = code_of_http(r->status);
    count(stats, "REST", c, code,
          code == absl::StatusCode::kOk ? rest_sum(*r, c) : absl::StatusOr<double>(0.0), r->body);
    if (request.closes || !r->keep_alive) {
      stats.reconnects.fetch_add(1);
      if (const bool up = co_await connect(); !up) {
        stats.problem("REST: cannot reconnect");
        co_return;
      }
    }
  }
}

}  // namespace

void run_rest(const kserve_load& load, load_stats& stats) {
  asio::io_context io;
  asio::error_code ec;
  const tcp::endpoint server(asio::ip::make_address(load.host, ec),
                             static_cast<unsigned short>(load.port));
  if (ec) {
    stats.problem(absl::StrCat("--host=", load.host, ": ", ec.message()));
    return;
  }
  std::vector<std::future<void>> done;
  for (int i = 0; i < std::max(1, load.connections); ++i) {
    done.push_back(asio::co_spawn(io, drive_rest(i, load, server, stats), asio::use_future));
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < std::max(1, load.threads); ++i) threads.emplace_back([&io] { io.run(); });
  for (std::thread& t : threads) t.join();
  for (std::future<void>& f : done) f.get();
}

// ---- gRPC ----

void run_grpc(const kserve_load& load, load_stats& stats) {
  auto drive = [&](int index) {
    std::mt19937 rng = connection_rng(load, index);
    grpc::ChannelArguments args;
    // A connection of its own for each channel.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxSendMessageSize(-1);
    args.SetMaxReceiveMessageSize(-1);
    const std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
        absl::StrCat(load.host, ":", load.port), grpc::InsecureChannelCredentials(), args);
    const auto stub = inference::GRPCInferenceService::NewStub(channel);
    std::uint64_t tag = first_tag(index);
    while (clock::now() < load.stop_at) {
      const sum_case c = make_case(++tag, rng, load, front::grpc);
      const inference::ModelInferRequest request = to_message(c);
      inference::ModelInferResponse response;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      const clock::time_point start = clock::now();
      stats.bytes_sent.fetch_add(request.ByteSizeLong());
      const grpc::Status s = stub->ModelInfer(&context, request, &response);
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
          s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        stats.problem(
            absl::StrCat("gRPC request ", c.tag, ": ",
                         absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())),
                         " ", s.error_message()));
        return;
      }
      if (c.kind == fault::none) stats.latency.add(clock::now() - start);
      const auto code = static_cast<absl::StatusCode>(s.error_code());
      count(stats, "gRPC", c, code,
            s.ok() ? kserve::sum_of(response, std::to_string(c.tag)) : absl::StatusOr<double>(0.0),
            s.error_message());
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < std::max(1, load.connections); ++i) threads.emplace_back(drive, i);
  for (std::thread& t : threads) t.join();
}

// ---- UCX ----

#if defined(DLASYNC_EXAMPLES_HAVE_UCX)
void with_ucx_client(const std::string& transports, int threads, load_stats& stats,
                     const std::function<void(ucx_client&)>& use) {
  asio::io_context io;
  // The worker's progress runs on io's threads: they must not find io
  // without work and return before the client exists.
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work(io.get_executor());
  std::vector<std::thread> progress;
  for (int i = 0; i < std::max(1, threads); ++i) progress.emplace_back([&io] { io.run(); });
  absl::StatusOr<std::unique_ptr<ucx_client>> client =
      ucx_client::create(io.get_executor(), transports);
  if (!client.ok()) {
    stats.problem(client.status().ToString());
  } else {
    use(**client);
    (*client)->stop();
  }
  work.reset();
  for (std::thread& t : progress) t.join();
}

namespace {

// Valid requests' inputs published as remote bundles (--remote_inputs), on
// a node of this process that the server fetches them from; every
// producer's deleter is counted.
class bundle_publisher {
 public:
  static absl::StatusOr<std::unique_ptr<bundle_publisher>> create(const std::string& address,
                                                                  const std::string& transports) {
    runtime_options ro;
    ro.cuda = "off";
    absl::StatusOr<std::unique_ptr<runtime>> rt = runtime::create(ro);
    if (!rt.ok()) return rt.status();
    remote_node_options no;
    no.listen_address = address;
    no.transports = transports;
    absl::StatusOr<std::unique_ptr<remote_node>> node = remote_node::create(**rt, no);
    if (!node.ok()) return node.status();
    auto p = std::unique_ptr<bundle_publisher>(new bundle_publisher());
    p->rt_ = *std::move(rt);
    p->node_ = *std::move(node);
    return p;
  }

  // `m` with its input's bytes published as a bundle of one and named by
  // it, instead of carried in raw_input_contents.
  absl::Status publish(inference::ModelInferRequest& m) {
    auto bytes = std::make_shared<std::string>(std::move(*m.mutable_raw_input_contents(0)));
    m.clear_raw_input_contents();
    inference::ModelInferRequest::InferInputTensor& in = *m.mutable_inputs(0);
    absl::StatusOr<dtype> type = kserve::dtype_of(in.datatype());
    if (!type.ok()) return type.status();
    tensor_description d;
    d.data = bytes->data();
    d.dtype = *type;
    d.shape.assign(in.shape().begin(), in.shape().end());
    std::array<managed_tensor, 1> sources{
        make_managed_tensor(std::move(d), [this, bytes] { released_.fetch_add(1); })};
    publish_options po;
    po.lease = std::chrono::seconds(30);
    absl::StatusOr<remote_bundle> b = node_->publish_bundle(sources, po);
    if (!b.ok()) return b.status();
    published_.fetch_add(1);
    (*m.mutable_parameters())["dlasync_bundle"].set_string_param(absl::Base64Escape(b->encode()));
    (*in.mutable_parameters())["dlasync_bundle_member"].set_int64_param(0);
    return absl::OkStatus();
  }

  // Ends every publication and checks that each producer was released once.
  void finish(load_stats& stats) {
    node_->shutdown();
    rt_->shutdown();
    std::printf("  remote inputs: %llu bundles published, %llu producers released\n",
                static_cast<unsigned long long>(published_.load()),
                static_cast<unsigned long long>(released_.load()));
    if (published_.load() != released_.load()) {
      stats.problem(absl::StrCat(published_.load(), " bundles published, ", released_.load(),
                                 " producers released"));
    }
  }

 private:
  bundle_publisher() = default;

  std::unique_ptr<runtime> rt_;
  std::unique_ptr<remote_node> node_;
  std::atomic<std::uint64_t> published_{0};
  std::atomic<std::uint64_t> released_{0};
};

}  // namespace

void run_ucx(const kserve_load& load, const std::string& ucx_transports, load_stats& stats) {
  std::unique_ptr<bundle_publisher> bundles;
  if (!load.remote_inputs_address.empty()) {
    absl::StatusOr<std::unique_ptr<bundle_publisher>> b =
        bundle_publisher::create(load.remote_inputs_address, ucx_transports);
    if (!b.ok()) {
      stats.problem(absl::StrCat("--remote_inputs: ", b.status().ToString()));
      return;
    }
    bundles = *std::move(b);
  }
  with_ucx_client(ucx_transports, load.threads, stats, [&](ucx_client& client) {
    auto drive = [&](int index) {
      std::mt19937 rng = connection_rng(load, index);
      absl::StatusOr<int> c = client.connect(load.host, load.port);
      if (!c.ok()) {
        stats.problem(absl::StrCat("UCX connection ", index, ": ", c.status().ToString()));
        return;
      }
      constexpr auto timeout = std::chrono::seconds(30);
      std::uint64_t tag = first_tag(index);
      while (clock::now() < load.stop_at) {
        const sum_case k = make_case(++tag, rng, load, front::ucx);
        const clock::time_point start = clock::now();
        absl::StatusOr<ucx_answer> r;
        if (k.kind == fault::framing || k.filler > 0) {
          // Refused on its header or its length, before its data is taken.
          auto header = ucx_request_header(k.tag).encode();
          if (k.kind == fault::framing) header[0] = std::byte{'H'};
          const std::size_t data = k.filler > 0 ? k.filler : 128;
          stats.bytes_sent.fetch_add(header.size() + data);
          const absl::Status sent =
              client.send_raw(*c, ucx_request_am, true, header, data, std::byte{0});
          r = sent.ok() ? client.receive(*c, timeout) : absl::StatusOr<ucx_answer>(sent);
        } else {
          std::vector<std::byte> message;
          if (k.kind == fault::not_a_request) {
            message.assign(64, std::byte{0xFF});
          } else {
            inference::ModelInferRequest m = to_message(k);
            if (bundles != nullptr && k.kind == fault::none) {
              if (absl::Status s = bundles->publish(m); !s.ok()) {
                stats.problem(
                    absl::StrCat("UCX request ", k.tag, ": publishing its input: ", s.ToString()));
                return;
              }
            }
            message = kserve::serialize(m);
          }
          stats.bytes_sent.fetch_add(ucx_header_bytes + message.size());
          r = client.call(*c, k.tag, message, timeout);
        }
        if (!r.ok()) {
          stats.problem(absl::StrCat("UCX request ", k.tag, ": ", r.status().ToString()));
          return;
        }
        if (k.kind == fault::none) stats.latency.add(clock::now() - start);
        if (r->tag != k.tag) {
          stats.problem(absl::StrCat("UCX request ", k.tag, ": answered with tag ", r->tag));
          continue;
        }
        count(stats, "UCX", k, r->code,
              r->code == absl::StatusCode::kOk ? kserve::sum_of(r->bytes, std::to_string(k.tag))
                                               : absl::StatusOr<double>(0.0),
              r->bytes);
      }
    };
    std::vector<std::thread> connections;
    for (int i = 0; i < std::max(1, load.connections); ++i) connections.emplace_back(drive, i);
    for (std::thread& t : connections) t.join();
  });
  if (bundles != nullptr) bundles->finish(stats);
}
#else
void run_ucx(const kserve_load&, const std::string&, load_stats& stats) {
  stats.problem("--transport=ucx: this build has no UCX (libucx-dev)");
}
#endif

}  // namespace dlasync::examples
