// libFuzzer target: a remote node's active-message handlers, driven by a
// peer that sends whatever the input says, over real UCX in this process.
//
// The node under test (a runtime with a remote node, publishing one tensor
// for any number of importers) listens on loopback; the peer is a bare
// ucx_worker. An input is a mode byte and then records, each one active
// message: an id (one of the protocol's, or any 16-bit id), a header and
// data of the input's bytes, sent with or without a reply endpoint. A
// record may ask to have the protocol's fields filled in right (magic,
// version, the lease, the digest, the last hold's id and secret, the
// request id the node is waiting on), so that the fuzzer reaches past the
// first checks.
//   mode even: the peer is an importer, and the node the exporter;
//   mode odd:  the node imports a tensor from the peer, which answers its
//              hold request with the records.
// What must hold: no crash or sanitizer report, the node answers a valid
// hold request after every input (it was not stopped), and nothing leaks
// once the node and its peer are taken down at exit.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "asio/io_context.hpp"
#include "asio/use_future.hpp"
#include "dlasync/dlasync.hpp"
#include "dlasync/remote.hpp"
#include "remote/src/plan_remote.hpp"
#include "remote/src/protocol.hpp"
#include "remote/src/ucx_worker.hpp"

namespace {

using namespace dlasync;
using namespace dlasync::remote_detail;
using namespace std::chrono_literals;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_node_messages: %s\n", what);
  __builtin_trap();
}

// The peer: a bare worker, progressed only here.
struct peer {
  asio::io_context io;  // never run: progress is driven by hand
  std::shared_ptr<ucx_worker> ucx;
  ucp_ep_h to_node = nullptr;
  ucp_ep_h from_node = nullptr;  // the node's connection, when it imports
  std::uint16_t port = 0;
  hold_reply last_reply{};
  bool replied = false;
  hold_request asked{};
  bool asked_seen = false;

  static ucs_status_t on_reply(void* arg, const void* header, std::size_t length, void*,
                               std::size_t, const ucp_am_recv_param_t*) {
    auto* self = static_cast<peer*>(arg);
    if (length == sizeof(hold_reply)) {
      std::memcpy(&self->last_reply, header, sizeof(hold_reply));
      self->replied = true;
    }
    return UCS_OK;
  }
  static ucs_status_t on_drop(void*, const void*, std::size_t, void*, std::size_t,
                              const ucp_am_recv_param_t*) {
    return UCS_OK;
  }
  static ucs_status_t on_request(void* arg, const void* header, std::size_t length, void*,
                                 std::size_t, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<peer*>(arg);
    if (length == sizeof(hold_request) &&
        (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0) {
      std::memcpy(&self->asked, header, sizeof(hold_request));
      self->asked_seen = true;
      self->from_node = param->reply_ep;
    }
    return UCS_OK;
  }
  static void on_connection(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<peer*>(arg);
    (void)self->ucx->accept(request, nullptr, nullptr);
  }

  void progress_for(std::chrono::milliseconds d, bool (*until)(peer&) = nullptr) {
    const auto end = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < end) {
      {
        std::lock_guard lock(ucx->mutex());
        ucp_worker_progress(ucx->worker());
      }
      if (until != nullptr && until(*this)) return;
    }
  }
};

struct world {
  std::unique_ptr<runtime> rt;
  std::unique_ptr<remote_node> node;
  std::shared_ptr<std::vector<float>> memory;
  remote_descriptor published;
  peer p;
};

world* the_one = nullptr;

// At exit, everything goes down before LeakSanitizer looks (libFuzzer's
// checks between inputs are off for this target: the node keeps state
// across inputs, connections and UCX's pools among it).
void take_down() {
  world* w = std::exchange(the_one, nullptr);
  if (w == nullptr) return;
  {
    std::lock_guard lock(w->p.ucx->mutex());
    w->p.ucx->finalize();
  }
  w->node->shutdown();
  w->node.reset();
  w->rt.reset();
  delete w;
}

world& the_world() {
  static world* w = [] {
    auto* w = new world();
    runtime_options ro;
    ro.worker_threads = 1;
    ro.cuda = "off";
    w->rt = *runtime::create(ro);
    remote_node_options no;
    no.transports = "tcp";
    no.import_timeout = 50ms;
    w->node = *remote_node::create(*w->rt, no);
    // Every other row of a 64 x 64 array: pieces by rows or a gathered copy.
    w->memory = std::make_shared<std::vector<float>>(128 * 64, 1.0f);
    tensor_description d;
    d.data = w->memory->data();
    d.shape = {64, 64};
    d.strides = {128, 1};
    managed_tensor t = make_managed_tensor(std::move(d), [m = w->memory] {});
    publish_options po;
    po.importers = 1U << 30;
    po.lease = std::chrono::hours(24);
    w->published = *w->node->publish(t, po);
    auto ucx = ucx_worker::create(w->p.io.get_executor(), "tcp");
    if (!ucx.ok()) fail("peer worker");
    w->p.ucx = *std::move(ucx);
    std::lock_guard lock(w->p.ucx->mutex());
    (void)w->p.ucx->set_am_handler(am_hold_reply, &peer::on_reply, &w->p);
    (void)w->p.ucx->set_am_handler(am_piece, &peer::on_drop, &w->p);
    (void)w->p.ucx->set_am_handler(am_hold_request, &peer::on_request, &w->p);
    w->p.to_node = *w->p.ucx->connect(w->published.exporter_address, w->published.exporter_port,
                                      nullptr, nullptr);
    w->p.port = *w->p.ucx->listen("127.0.0.1", 0, &peer::on_connection, &w->p);
    // Registered last, so that it runs before the statics made above go.
    the_one = w;
    std::atexit(take_down);
    return w;
  }();
  return *w;
}

class reader {
 public:
  reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::vector<std::byte> bytes(std::size_t n) {
    n = std::min(n, size_ - std::min(pos_, size_));
    std::vector<std::byte> out(reinterpret_cast<const std::byte*>(data_ + pos_),
                               reinterpret_cast<const std::byte*>(data_ + pos_ + n));
    pos_ += n;
    return out;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// The protocol's fields filled in right, as far as the header holds them.
void patch(world& w, unsigned id, std::vector<std::byte>& header) {
  auto fill = [&header](auto m) {
    if (header.size() >= sizeof(m)) std::memcpy(header.data(), &m, sizeof(m));
  };
  if (id == am_hold_request) {
    hold_request m;
    if (!header.empty()) std::memcpy(&m, header.data(), std::min(header.size(), sizeof(m)));
    m.magic = protocol_magic;
    m.version = protocol_version;
    m.lease_id = w.published.lease_id;
    m.digest = description_digest(w.published);
    fill(m);
  } else if (id == am_hold_release) {
    hold_release m;
    m.lease_id = w.published.lease_id;
    m.hold_id = w.p.last_reply.hold_id;
    m.secret = w.p.last_reply.secret;
    fill(m);
  } else if (id == am_hold_reply) {
    hold_reply m;
    if (!header.empty()) std::memcpy(&m, header.data(), std::min(header.size(), sizeof(m)));
    m.magic = protocol_magic;
    m.request_id = w.p.asked.request_id;
    fill(m);
  } else if (id == am_piece) {
    piece m;
    if (!header.empty()) std::memcpy(&m, header.data(), std::min(header.size(), sizeof(m)));
    m.magic = protocol_magic;
    m.request_id = w.p.asked.request_id;
    fill(m);
  }
}

void send_records(world& w, reader& in, ucp_ep_h ep) {
  static constexpr unsigned ours[] = {am_hold_request, am_hold_reply, am_hold_release, am_piece};
  for (int n = 0; n < 16 && !in.empty(); ++n) {
    const std::uint8_t kind = in.byte();
    const std::uint8_t flags = in.byte();
    unsigned id = ours[kind & 3];
    if ((kind & 0x80) != 0) id = (static_cast<unsigned>(in.byte()) << 8) | in.byte();
    std::vector<std::byte> header = in.bytes(in.byte());
    std::size_t data_bytes = in.byte();
    if ((flags & 4) != 0) data_bytes <<= 12;  // up to 1 MiB: rendezvous
    std::vector<std::byte> data = in.bytes(data_bytes);
    data.resize(data_bytes, std::byte{0x5a});
    if ((flags & 2) != 0) patch(w, id, header);
    ucx_worker::am_message m;
    m.id = id;
    m.bytes = std::move(header);
    m.header_bytes = m.bytes.size();
    m.bytes.insert(m.bytes.end(), data.begin(), data.end());
    m.reply = (flags & 1) != 0;
    std::lock_guard lock(w.p.ucx->mutex());
    (void)w.p.ucx->send_am(ep, std::move(m));
  }
}

// A valid hold request from the peer, answered by the node.
void node_answers(world& w) {
  hold_request m;
  m.lease_id = w.published.lease_id;
  m.request_id = 0xfeed;
  m.digest = description_digest(w.published);
  m.send_bytes = 1;
  w.p.replied = false;
  {
    std::lock_guard lock(w.p.ucx->mutex());
    ucx_worker::am_message msg;
    msg.id = am_hold_request;
    const auto* b = reinterpret_cast<const std::byte*>(&m);
    msg.bytes.assign(b, b + sizeof(m));
    msg.header_bytes = sizeof(m);
    msg.reply = true;
    (void)w.p.ucx->send_am(w.p.to_node, std::move(msg));
  }
  w.p.progress_for(10s, [](peer& p) { return p.replied && p.last_reply.request_id == 0xfeed; });
  if (!w.p.replied) fail("the node stopped answering hold requests");
  if (w.p.last_reply.code != 0) return;
  hold_release r;
  r.lease_id = w.published.lease_id;
  r.hold_id = w.p.last_reply.hold_id;
  r.secret = w.p.last_reply.secret;
  std::lock_guard lock(w.p.ucx->mutex());
  ucx_worker::am_message msg;
  msg.id = am_hold_release;
  const auto* b = reinterpret_cast<const std::byte*>(&r);
  msg.bytes.assign(b, b + sizeof(r));
  msg.header_bytes = sizeof(r);
  msg.reply = true;
  (void)w.p.ucx->send_am(w.p.to_node, std::move(msg));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  world& w = the_world();
  reader in(data, size);
  const std::uint8_t mode = in.byte();
  if ((mode & 1) == 0) {
    send_records(w, in, w.p.to_node);
    w.p.progress_for(5ms);
  } else {
    // The node imports from the peer, which answers with the records.
    remote_descriptor d = w.published;
    d.exporter_address = "127.0.0.1";
    d.exporter_port = w.p.port;
    w.p.asked_seen = false;
    std::future<absl::StatusOr<tensor>> f = async_import_remote(*w.node, d, {}, asio::use_future);
    w.p.progress_for(2s, [](peer& p) { return p.asked_seen; });
    if (w.p.asked_seen) send_records(w, in, w.p.from_node);
    while (f.wait_for(1ms) != std::future_status::ready) w.p.progress_for(1ms);
    (void)f.get();
  }
  node_answers(w);
  return 0;
}
