// libFuzzer target: the inference server's UCX transport (ucx_front) against
// arbitrary active messages from a real UCX peer in the same process.
//
// A ucx_front listens on 127.0.0.1 with small budgets and queue bounds; a
// second dlasync::ucx_worker connects to it through its listener, both over
// UCX's TCP transport, so UCX's own handling (eager and rendezvous protocols,
// reply endpoints, ids without a handler, which must be dropped) runs as it
// does between hosts. Each input is a short sequence of messages (at most 8,
// at most 2 MiB of data in all), each:
//
//   byte 0    flags: bit 0 the reply flag; bits 1-2 the kind: 0 any header,
//             1 a request's header (a nonzero reserved word when byte 3's
//             top bits say so) with any data, 2 a valid request (a
//             serialized ModelInferRequest), 3 any header; bit 3 a large
//             payload (rendezvous); bit 4 the server's request id (0x51),
//             else bytes 1-2
//   bytes 1-2 the active-message id, little-endian
//   byte 3    the header's length (kinds 0, 3: up to 63 bytes taken from the
//             input after byte 6), the data's first bytes (kind 1: as many
//             taken), or the valid request's size
//   bytes 4-5 the payload's length: small, up to 4 KiB; large, 16 to 272 KiB
//   byte 6    the payload's byte
//
// Then one valid request, which must be answered. What must hold for every
// input (else the target traps):
//   - no sanitizer report, no crash, no hang: each wait is bounded;
//   - every message to 0x51 with the reply flag is answered exactly once,
//     with a response's header, and so is the valid request after them,
//     with OK and its sum;
//   - once the server is quiet, its budget holds nothing and no request is in
//     progress; at exit, once the server and its peer are taken down,
//     LeakSanitizer finds nothing.
// scripts/fuzz.sh runs it with UCX_LOG_LEVEL=error (UCX warns of each message
// to an id without a handler) and without libFuzzer's leak checks between
// inputs (UCX keeps its endpoints' parts in pools LeakSanitizer does not scan,
// so a check while they live reports them).
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "asio/executor_work_guard.hpp"
#include "asio/io_context.hpp"
#include "dlasync/dlasync.hpp"
#include "kserve_requests.hpp"
#include "remote/src/ucx_worker.hpp"
#include "ucx_front.hpp"
#include "ucx_protocol.hpp"

namespace {

using namespace dlasync;
using namespace dlasync::examples;
using namespace std::chrono_literals;

// Small enough that one input can fill it, so that requests wait for room
// and meet the queue bounds.
constexpr std::uint64_t budget_bytes = 256 << 10;
constexpr std::size_t most_messages = 8;
// TCP, where a rendezvous payload needs its sender to serve the receiver's
// reads, as between hosts. (UCX 1.13 also loses a few allocations of its own
// when it connects over shared memory with peer error handling, which
// LeakSanitizer would report.)
constexpr const char* transports = "tcp";
constexpr std::size_t most_data = 2 << 20;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_ucx_server: %s\n", what);
  __builtin_trap();
}

// A request message: the header with `tag`, then a `sum` request of `n`
// FP32 ones (sum n).
std::vector<std::byte> ones_request(std::uint64_t tag, std::uint32_t n) {
  const std::vector<float> ones(n, 1.0F);
  return ucx_request_bytes(tag, kserve::serialize(kserve::sum_request(std::to_string(tag), ones)));
}

// The server's answer: a message that parses, answered with the sum of its
// first raw contents as FP32 (no import: the handler behind the transport is
// not what is fuzzed here).
asio::awaitable<absl::StatusOr<std::string>> handle(ucx_front::message m) {
  inference::ModelInferRequest r;
  if (!r.ParseFromArray(m.bytes.get(), static_cast<int>(m.length))) {
    co_return absl::InvalidArgumentError("not a ModelInferRequest");
  }
  if (r.raw_input_contents_size() != 1 || r.raw_input_contents(0).size() % 4 != 0) {
    co_return absl::InvalidArgumentError("not one input of FP32");
  }
  const std::string& raw = r.raw_input_contents(0);
  double sum = 0;
  for (std::size_t i = 0; i < raw.size(); i += 4) {
    float v = 0;
    std::memcpy(&v, raw.data() + i, 4);
    sum += v;
  }
  inference::ModelInferResponse response;
  response.set_id(r.id());
  auto* out = response.add_outputs();
  out->set_name("SUM");
  out->set_datatype("FP64");
  out->add_shape(1);
  response.add_raw_output_contents()->assign(reinterpret_cast<const char*>(&sum), sizeof sum);
  co_return response.SerializeAsString();
}

// The server and its peer, made once: UCX's start-up costs milliseconds.
struct setup {
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::shared_ptr<memory_budget> budget = std::make_shared<memory_budget>(budget_bytes);
  std::unique_ptr<ucx_front> front;
  std::shared_ptr<ucx_worker> peer;
  ucp_ep_h ep = nullptr;
  // Answers the peer received, under the peer's mutex.
  std::size_t answers = 0;
  // The answer to the request tagged `last_tag`: its code and data.
  std::optional<std::pair<absl::StatusCode, std::string>> last;
  std::uint64_t last_tag = 0;
  bool taking_down = false;  // at exit: the connection goes

  static ucs_status_t on_answer(void* arg, const void* header, std::size_t length, void* data,
                                std::size_t data_length, const ucp_am_recv_param_t* param) {
    auto* s = static_cast<setup*>(arg);
    ++s->answers;
    const std::optional<ucx_header> h =
        ucx_header::decode(std::span(static_cast<const std::byte*>(header), length));
    if (!h || h->magic != ucx_response_magic) fail("an answer without a response's header");
    // Every answer here is short: an error's text, or one sum.
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) fail("an answer by rendezvous");
    if (h->tag == s->last_tag) {
      s->last.emplace(static_cast<absl::StatusCode>(h->word),
                      std::string(static_cast<const char*>(data), data_length));
    }
    return UCS_OK;
  }

  setup() {
    work.emplace(io.get_executor());
    for (int i = 0; i < 2; ++i) threads.emplace_back([this] { io.run(); });
    ucx_front::options o;
    o.transports = transports;
    o.max_body = 512 << 10;  // bodies between the budget and this are refused by the budget
    o.connection_budget = 128 << 10;
    o.read_timeout = 5000ms;
    o.max_queued_requests = 2;
    o.max_queued_bytes = 8 << 10;
    absl::StatusOr<std::unique_ptr<ucx_front>> f =
        ucx_front::create(io.get_executor(), o, budget, handle, [](absl::StatusCode) {});
    if (!f.ok()) fail("the front does not listen");
    front = *std::move(f);
    absl::StatusOr<std::shared_ptr<ucx_worker>> w =
        ucx_worker::create(io.get_executor(), transports);
    if (!w.ok()) fail("the peer's worker");
    peer = *std::move(w);
    std::lock_guard lock(peer->mutex());
    if (!peer->set_am_handler(ucx_response_am, &setup::on_answer, this).ok()) fail("handler");
    // The server never closes this connection, so an error is a finding.
    absl::StatusOr<ucp_ep_h> connected = peer->connect(
        "127.0.0.1", front->port(),
        [](void* arg, ucp_ep_h, ucs_status_t) {
          if (!static_cast<setup*>(arg)->taking_down) fail("the connection broke");
        },
        this);
    if (!connected.ok()) fail("cannot connect");
    ep = *connected;
  }
};

// Made, and connected, before the first input; taken down at exit, so that
// LeakSanitizer's last look finds nothing of it.
setup* the_setup = nullptr;

void take_down() {
  setup* s = std::exchange(the_setup, nullptr);
  {
    std::lock_guard lock(s->peer->mutex());
    s->taking_down = true;
  }
  s->front->stop();
  {
    std::lock_guard lock(s->peer->mutex());
    s->peer->close_endpoint(s->ep);
    s->peer->finalize();
  }
  s->work.reset();
  s->io.stop();
  for (std::thread& t : s->threads) t.join();
  delete s;
}

// Waits until every send is over, `expected` answers came, nothing is in
// progress and the budget is empty. Bounded: a hang is a finding.
void wait_quiet(setup& s, std::size_t expected) {
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    bool quiet = false;
    {
      std::lock_guard lock(s.peer->mutex());
      s.peer->progress();
      if (s.answers > expected) fail("more answers than requests that asked for one");
      quiet = s.peer->sends_pending() == 0 && s.answers == expected;
    }
    quiet = quiet && s.front->requests_in_progress().total() == 0 && s.budget->in_use() == 0;
    if (quiet) return;
    if (std::chrono::steady_clock::now() > give_up) fail("the server did not go quiet in 5 s");
    std::this_thread::sleep_for(100us);
  }
}

void send(setup& s, unsigned id, bool reply, std::vector<std::byte> bytes, std::size_t header) {
  ucx_worker::am_message m;
  m.id = id;
  m.bytes = std::move(bytes);
  m.header_bytes = header;
  m.reply = reply;
  std::lock_guard lock(s.peer->mutex());
  const ucs_status_t status = s.peer->send_am(s.ep, std::move(m));
  if (UCS_STATUS_IS_ERR(status)) fail("the peer cannot send");
  s.peer->progress();
}

// Sends a valid request after `answered` answers, and checks that it is
// answered OK, and that the server goes quiet.
void check_served(setup& s, std::size_t answered) {
  constexpr std::uint32_t ones = 100;
  constexpr std::uint64_t tag = 1ULL << 60;
  {
    std::lock_guard lock(s.peer->mutex());
    s.last.reset();
    s.last_tag = tag;
  }
  send(s, ucx_request_am, true, ones_request(tag, ones), ucx_header_bytes);
  wait_quiet(s, answered + 1);
  std::lock_guard lock(s.peer->mutex());
  if (!s.last || s.last->first != absl::StatusCode::kOk) {
    fail("a valid request was not answered OK");
  }
  const absl::StatusOr<double> sum = kserve::sum_of(s.last->second, std::to_string(tag));
  if (!sum.ok() || *sum != ones) fail("a valid request was not answered with its sum");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  the_setup = new setup();
  the_setup->peer->start();
  check_served(*the_setup, 0);
  std::atexit(take_down);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  setup& s = *the_setup;
  {
    std::lock_guard lock(s.peer->mutex());
    s.answers = 0;
  }
  std::size_t expected = 0;
  std::size_t at = 0;
  std::size_t total = 0;
  for (std::size_t n = 0; n < most_messages && size - at >= 7; ++n) {
    const std::uint8_t flags = data[at];
    const bool reply = (flags & 1) != 0;
    const int kind = (flags >> 1) & 3;
    const bool large = (flags & 8) != 0;
    unsigned id = (flags & 16) != 0 ? ucx_request_am : data[at + 1] | (data[at + 2] << 8);
    const std::uint8_t sized = data[at + 3];
    const unsigned length = data[at + 4] | (data[at + 5] << 8);
    const auto fill = static_cast<std::byte>(data[at + 6]);
    at += 7;
    std::size_t payload = large ? (16u << 10) + length * 4u : length % 4096u;
    if (total + payload > most_data) payload = 0;
    total += payload;
    std::vector<std::byte> bytes;
    std::size_t header = 0;
    if (kind == 2) {
      // A valid request: FP32 ones, as many as byte 3 and the payload say.
      bytes = ones_request(1000 + n, static_cast<std::uint32_t>(sized * 16 + payload / 4));
      header = ucx_header_bytes;
    } else {
      const std::size_t taken = std::min<std::size_t>(sized & 63, size - at);
      if (kind == 1) {
        // A request's header (its reserved word what byte 3's top bits say),
        // then the taken bytes as the data's first.
        ucx_header h = ucx_request_header(2000 + n);
        h.word = sized >> 6;
        const auto encoded = h.encode();
        bytes.assign(encoded.begin(), encoded.end());
      }
      const auto* from = reinterpret_cast<const std::byte*>(data + at);
      bytes.insert(bytes.end(), from, from + taken);
      at += taken;
      header = kind == 1 ? ucx_header_bytes : bytes.size();
      bytes.resize(bytes.size() + payload, fill);
    }
    if (id == ucx_request_am && reply) ++expected;
    send(s, id, reply, std::move(bytes), header);
  }
  wait_quiet(s, expected);
  // A valid request after them: the connection still serves.
  check_served(s, expected);
  return 0;
}
