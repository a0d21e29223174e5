// A hostile peer for the remote-import tests: a UCX worker of its own that
// speaks dlasync's protocol wrongly on purpose, driven by lines on stdin,
// answering on stdout. It never uses dlasync's node: every byte it sends is
// chosen here.
//
// As an importer, after `connect <address> <port>` (an exporter's listener):
//   hold <hex descriptor> <send_bytes> <tamper 0|1> [<flags>]
//       -> "reply <code> <hold_id> <secret> <plan> <pieces> <bytes received>
//           <reply flags> <bytes with the reply>"
//          (tamper: the digest of a descriptor whose shape was changed;
//          flags: hold_request::flags, 1 to take the bytes with the grant)
//   hold_members <hex bundle> <variant>
//       -> the same answer as hold, for a bundle's hold request whose member
//          list is: honest (every member), repeat (member 0 twice),
//          descending, past_end (an index past the bundle), wrong_digest
//          (member 0's), ragged (3 bytes more), empty (the flag, no list),
//          too_many (one entry more than published), rendezvous (honest,
//          but sent by rendezvous), with_grant (honest, offering to take
//          the bytes with the grant), rma (honest, asking to read the
//          members itself: send_bytes 0)
//   release <lease> <hold_id> <secret> -> "sent"
//   forge_releases <lease> <n>  -> "sent": n releases with guessed holds
//   send <id> <reply 0|1> <header bytes> <data bytes> <seed>
//       -> "sent": one message of pseudo-random bytes
//   every_id <header bytes> <data bytes> -> "sent <n>": one message per id
//   keep_pieces -> "keeping": pieces that come by rendezvous are neither
//                  received nor dropped from now on, so their sends wait
//   stall       -> "stalled": the worker is never progressed again
// As an exporter:
//   listen <mode> <bytes> -> "listening <port>"; each hold request is
//       answered as <mode> says, for a tensor of <bytes> bytes:
//       huge_remaining  a grant with 2^63 us left, then the right piece
//       bad_pieces      a grant, then pieces out of range, of the wrong
//                       length, and twice
//       with_grant      a grant that carries the bytes (and ends the hold)
//       with_grant_short  the same, one byte short
//       unannounced_bytes a grant that carries the bytes without saying so
//       garbage         a refusal with an unknown code and no NUL
//       silent          no answer
//       lease_7_silent  no answer to a hold on lease 7; an honest grant
//                       and its piece to a hold on any other
//       every_id        every active-message id back, no answer
//       bundle_honest   a bundle's grant with each member's plan (one
//                       whole piece of <bytes>), then each member's piece
//       bundle_plans_short  the same grant, one member's plan short
//       bundle_wrong_member  the honest grant, then a piece of a member
//                       that was not asked for, then the honest pieces
//       bundle_packed   the honest grant, then every member in one packed
//                       message
//       bundle_packed_short  the same, each member one byte short
//       bundle_packed_twice  the same, every record naming member 0
//       bundle_packed_rndv  the honest packed message, by rendezvous
//       bundle_grant_partial  a grant that says it carries the members'
//                       bytes (and ends the hold), with one member of two
// quit -> "bye", exits 0. Options: --transports=<UCX_TLS list>.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "asio/executor_work_guard.hpp"
#include "asio/io_context.hpp"
#include "dlasync/remote.hpp"
#include "remote/remote_support.hpp"
#include "remote/src/plan_remote.hpp"
#include "remote/src/protocol.hpp"
#include "remote/src/ucx_worker.hpp"

namespace {

using namespace dlasync;
using namespace dlasync::remote_detail;

// The answers' stream: stdout as it was when the process started. UCX
// prints its log lines on stdout, which main() points at stderr.
FILE* answers = stdout;

void say(const std::string& line) {
  std::fprintf(answers, "%s\n", line.c_str());
  std::fflush(answers);
}

struct peer {
  asio::io_context io;
  std::shared_ptr<ucx_worker> ucx;
  std::thread runner;
  ucp_ep_h ep = nullptr;  // to the exporter, or the last importer
  std::string mode;
  std::uint64_t bytes = 0;
  std::vector<unsigned char> tensor;  // what this exporter "publishes"
  // The last hold reply, and the pieces' bytes that came.
  std::atomic<bool> replied{false};
  hold_reply reply;
  std::atomic<std::uint64_t> received{0};
  // The bytes that came with the last reply (a grant with its bytes).
  std::atomic<std::uint64_t> with_reply{0};
  bool keep = false;  // pieces by rendezvous are kept, never received

  static ucs_status_t on_reply(void* arg, const void* header, std::size_t length, void*,
                               std::size_t data_length, const ucp_am_recv_param_t*) {
    auto* self = static_cast<peer*>(arg);
    if (length == sizeof(hold_reply)) {
      std::memcpy(&self->reply, header, sizeof(hold_reply));
      self->with_reply = data_length;
      self->replied = true;
    }
    return UCS_OK;
  }
  // Packed members: their bytes count as received, their records do not.
  static ucs_status_t on_packed(void* arg, const void* header, std::size_t length, void*,
                                std::size_t data_length, const ucp_am_recv_param_t*) {
    auto* self = static_cast<peer*>(arg);
    packed m;
    if (length != sizeof(m)) return UCS_OK;
    std::memcpy(&m, header, sizeof(m));
    if (m.bytes <= data_length) self->received += m.bytes;
    return UCS_OK;
  }
  static ucs_status_t on_piece(void* arg, const void*, std::size_t, void*, std::size_t length,
                               const ucp_am_recv_param_t* param) {
    auto* self = static_cast<peer*>(arg);
    self->received += length;
    // Kept: the rendezvous is neither received nor dropped, so its sender
    // waits for good.
    if (self->keep && (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) return UCS_INPROGRESS;
    return UCS_OK;  // a rendezvous is dropped, and completed for its sender
  }
  static void on_connection(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<peer*>(arg);
    absl::StatusOr<ucp_ep_h> ep = self->ucx->accept(request, nullptr, nullptr);
    if (ep.ok()) self->ep = *ep;
  }
  static ucs_status_t on_request(void* arg, const void* header, std::size_t length, void* data,
                                 std::size_t data_length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<peer*>(arg);
    if (length != sizeof(hold_request) ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
      return UCS_OK;
    }
    hold_request m;
    std::memcpy(&m, header, sizeof(m));
    // A bundle's request: how many members it lists.
    const std::size_t members = data != nullptr ? data_length / sizeof(member_request) : 0;
    self->answer(m, members, param->reply_ep);
    return UCS_OK;
  }

  void send(ucp_ep_h to, unsigned id, const void* header, std::size_t header_bytes,
            const void* data, std::size_t data_bytes,
            ucx_worker::am_message::protocol how = ucx_worker::am_message::protocol::automatic) {
    ucx_worker::am_message msg;
    msg.carried_by = how;
    msg.id = id;
    const auto* h = static_cast<const std::byte*>(header);
    msg.bytes.assign(h, h + header_bytes);
    if (data_bytes > 0) {
      const auto* d = static_cast<const std::byte*>(data);
      msg.bytes.insert(msg.bytes.end(), d, d + data_bytes);
    }
    msg.header_bytes = header_bytes;
    msg.reply = true;
    (void)ucx->send_am(to, std::move(msg));
  }

  // Under the worker's lock (a UCX callback).
  void answer(const hold_request& m, std::size_t members, ucp_ep_h to) {
    hold_reply r;
    r.request_id = m.request_id;
    piece p;
    p.request_id = m.request_id;
    p.plan = static_cast<std::uint8_t>(piece_plan::whole);
    p.count = 1;
    p.length = bytes;
    if (mode.rfind("bundle_", 0) == 0) {
      // Every member asked for is one whole piece of `bytes`.
      r.hold_id = 1;
      r.secret = 2;
      r.remaining_us = 10'000'000;
      r.pieces = members;
      member_plan one;
      one.plan = p.plan;
      one.pieces = 1;
      std::vector<member_plan> plans(members, one);
      const std::size_t plan_bytes =
          members * sizeof(member_plan) - (mode == "bundle_plans_short" ? 8 : 0);
      if (mode.rfind("bundle_packed", 0) == 0 || mode == "bundle_grant_partial") {
        // The members packed: `k` of them, each `length` bytes.
        auto packed_message = [&](std::size_t k, std::uint64_t length) {
          packed h;
          h.entries = static_cast<std::uint32_t>(k);
          h.request_id = m.request_id;
          h.bytes = k * length;
          std::vector<unsigned char> out(sizeof(h));
          std::memcpy(out.data(), &h, sizeof(h));
          for (std::size_t i = 0; i < k; ++i) {
            packed_entry e;
            e.member = mode == "bundle_packed_twice" ? 0 : static_cast<std::uint32_t>(i);
            e.plan = p.plan;
            e.length = length;
            const auto* b = reinterpret_cast<const unsigned char*>(&e);
            out.insert(out.end(), b, b + sizeof(e));
          }
          for (std::size_t i = 0; i < k; ++i) {
            out.insert(out.end(), tensor.begin(), tensor.begin() + static_cast<long>(length));
          }
          return out;
        };
        if (mode == "bundle_grant_partial") {
          // The bytes with the grant, the hold ended, but member 1 missing.
          r.hold_id = 0;
          r.secret = 0;
          r.flags = reply_bytes_with_grant;
          std::vector<unsigned char> data(
              reinterpret_cast<unsigned char*>(plans.data()),
              reinterpret_cast<unsigned char*>(plans.data()) + plan_bytes);
          const std::vector<unsigned char> one_member = packed_message(1, bytes);
          data.insert(data.end(), one_member.begin(), one_member.end());
          send(to, am_hold_reply, &r, sizeof(r), data.data(), data.size(),
               ucx_worker::am_message::protocol::eager);
        } else {
          send(to, am_hold_reply, &r, sizeof(r), plans.data(), plan_bytes);
          const std::vector<unsigned char> all =
              packed_message(members, mode == "bundle_packed_short" ? bytes - 1 : bytes);
          send(to, am_packed, all.data(), sizeof(packed), all.data() + sizeof(packed),
               all.size() - sizeof(packed),
               mode == "bundle_packed_rndv" ? ucx_worker::am_message::protocol::rendezvous
                                            : ucx_worker::am_message::protocol::eager);
        }
        ucx->progress();
        return;
      }
      send(to, am_hold_reply, &r, sizeof(r), plans.data(), plan_bytes);
      if (mode == "bundle_wrong_member") {  // first, before the honest ones
        p.member = static_cast<std::uint32_t>(members);
        send(to, am_piece, &p, sizeof(p), tensor.data(), tensor.size());
      }
      for (std::size_t k = 0; k < members; ++k) {
        p.member = static_cast<std::uint32_t>(k);
        send(to, am_piece, &p, sizeof(p), tensor.data(), tensor.size());
      }
    } else if (mode == "lease_7_silent") {
      if (m.lease_id == 7) return;  // no answer, ever
      r.hold_id = m.request_id;
      r.secret = 2;
      r.remaining_us = 10'000'000;
      r.plan = p.plan;
      r.pieces = 1;
      send(to, am_hold_reply, &r, sizeof(r), nullptr, 0);
      send(to, am_piece, &p, sizeof(p), tensor.data(), tensor.size());
    } else if (mode == "huge_remaining") {
      r.hold_id = 1;
      r.secret = 2;
      r.remaining_us = std::uint64_t{1} << 63;
      r.plan = p.plan;
      r.pieces = 1;
      send(to, am_hold_reply, &r, sizeof(r), nullptr, 0);
      send(to, am_piece, &p, sizeof(p), tensor.data(), tensor.size());
    } else if (mode == "bad_pieces") {
      r.hold_id = 1;
      r.secret = 2;
      r.remaining_us = 10'000'000;
      r.plan = p.plan;
      r.pieces = 1;
      send(to, am_hold_reply, &r, sizeof(r), nullptr, 0);
      piece far = p;
      far.index = 5;  // out of range
      send(to, am_piece, &far, sizeof(far), tensor.data(), tensor.size());
      piece longer = p;
      longer.length = bytes + 4096;  // more than the buffer
      std::vector<unsigned char> more(bytes + 4096, 0xAA);
      send(to, am_piece, &longer, sizeof(longer), more.data(), more.size());
      piece offset = p;
      offset.offset = std::uint64_t{1} << 62;
      send(to, am_piece, &offset, sizeof(offset), tensor.data(), tensor.size());
      send(to, am_piece, &p, sizeof(p), tensor.data(), tensor.size());
      send(to, am_piece, &p, sizeof(p), tensor.data(), tensor.size());  // twice
    } else if (mode == "with_grant" || mode == "with_grant_short" || mode == "unannounced_bytes") {
      // The bytes as the grant's data: honestly, one byte short, or without
      // the flag that announces them.
      r.hold_id = 1;
      r.secret = 2;
      r.remaining_us = 10'000'000;
      r.plan = p.plan;
      r.pieces = 1;
      if (mode != "unannounced_bytes") r.flags = reply_bytes_with_grant;
      const std::size_t n = mode == "with_grant_short" ? tensor.size() - 1 : tensor.size();
      send(to, am_hold_reply, &r, sizeof(r), tensor.data(), n);
    } else if (mode == "garbage") {
      r.code = 12345;
      std::memset(r.message, 'G', sizeof(r.message));  // no NUL
      send(to, am_hold_reply, &r, sizeof(r), nullptr, 0);
    } else if (mode == "every_id") {
      std::vector<unsigned char> junk(64, 0x5A);
      for (unsigned id = 0; id < ucx_worker::max_am_ids; ++id) {
        send(to, id, junk.data(), id % 3 == 0 ? 0 : junk.size(), junk.data(), junk.size());
        if (id % 256 == 255) ucx->progress();
      }
    }
    // silent: no answer.
    ucx->progress();
  }
};

// The answer to the hold request just sent, as `hold` and `hold_members`
// report it, with the pieces' bytes that came within 100 ms of it.
std::string awaited_reply(peer& p) {
  for (int i = 0; i < 20000 && !p.replied; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!p.replied) return "no reply";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // pieces, if any
  const hold_reply& r = p.reply;
  return "reply " + std::to_string(r.code) + " " + std::to_string(r.hold_id) + " " +
         std::to_string(r.secret) + " " + std::to_string(r.plan) + " " + std::to_string(r.pieces) +
         " " + std::to_string(p.received.load()) + " " + std::to_string(r.flags) + " " +
         std::to_string(p.with_reply.load());
}

}  // namespace

// NOLINTNEXTLINE(bugprone-exception-escape): what escapes main ends the program with its message
int main(int argc, char** argv) {
  answers = fdopen(dup(STDOUT_FILENO), "w");
  dup2(STDERR_FILENO, STDOUT_FILENO);
  std::string transports;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--transports=", 0) == 0) transports = a.substr(13);
  }
  peer p;
  auto work = asio::make_work_guard(p.io);
  auto w = ucx_worker::create(p.io.get_executor(), transports);
  if (!w.ok()) {
    say("error " + std::string(w.status().message()));
    return 1;
  }
  p.ucx = *std::move(w);
  {
    std::lock_guard lock(p.ucx->mutex());
    (void)p.ucx->set_am_handler(am_hold_reply, &peer::on_reply, &p);
    (void)p.ucx->set_am_handler(am_piece, &peer::on_piece, &p);
    (void)p.ucx->set_am_handler(am_packed, &peer::on_packed, &p);
    (void)p.ucx->set_am_handler(am_hold_request, &peer::on_request, &p);
  }
  p.ucx->start();
  p.runner = std::thread([&p] { p.io.run(); });
  say("ready");
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    if (command == "connect") {
      std::string address;
      std::uint16_t port = 0;
      in >> address >> port;
      std::lock_guard lock(p.ucx->mutex());
      absl::StatusOr<ucp_ep_h> ep = p.ucx->connect(address, port, nullptr, nullptr);
      if (!ep.ok()) {
        say("error " + std::string(ep.status().message()));
        continue;
      }
      p.ep = *ep;
      say("connected");
    } else if (command == "hold") {
      std::string hex;
      int send_bytes = 1;
      int tamper = 0;
      int flags = 0;  // optional: hold_request::flags
      in >> hex >> send_bytes >> tamper;
      if (!(in >> flags)) flags = 0;
      absl::StatusOr<remote_descriptor> d = remote_descriptor::decode(testing::from_hex(hex));
      if (!d.ok()) {
        say("error " + std::string(d.status().message()));
        continue;
      }
      hold_request m;
      m.send_bytes = static_cast<std::uint8_t>(send_bytes);
      m.flags = static_cast<std::uint8_t>(flags);
      m.lease_id = d->lease_id;
      m.request_id = 77;
      if (tamper != 0) d->shape[0] += 1;
      m.digest = description_digest(*d);
      p.replied = false;
      p.received = 0;
      p.with_reply = 0;
      {
        std::lock_guard lock(p.ucx->mutex());
        p.send(p.ep, am_hold_request, &m, sizeof(m), nullptr, 0);
        p.ucx->progress();
      }
      say(awaited_reply(p));
    } else if (command == "hold_members") {
      std::string hex;
      std::string variant;
      in >> hex >> variant;
      absl::StatusOr<remote_bundle> b = remote_bundle::decode(testing::from_hex(hex));
      if (!b.ok()) {
        say("error " + std::string(b.status().message()));
        continue;
      }
      hold_request m;
      m.flags = request_members;
      m.lease_id = b->lease_id;
      m.request_id = 78;
      std::vector<member_request> list;
      for (const remote_bundle::member& member : b->members) {
        member_request r;
        r.index = member.index;
        r.digest = description_digest(member.descriptor);
        list.push_back(r);
      }
      if (variant == "repeat") list.insert(list.begin() + 1, list.front());
      if (variant == "descending") std::swap(list.front(), list.back());
      if (variant == "past_end") list.back().index = b->published;
      if (variant == "wrong_digest") list.front().digest ^= 1;
      if (variant == "empty") list.clear();
      if (variant == "too_many") {
        member_request more = list.back();
        more.index = b->published;
        list.push_back(more);
      }
      std::string bytes(reinterpret_cast<const char*>(list.data()),
                        list.size() * sizeof(member_request));
      if (variant == "ragged") bytes += "xyz";
      if (variant == "with_grant") m.flags |= request_bytes_with_grant;
      if (variant == "rma") m.send_bytes = 0;  // to read the members itself
      p.replied = false;
      p.received = 0;
      p.with_reply = 0;
      {
        std::lock_guard lock(p.ucx->mutex());
        p.send(p.ep, am_hold_request, &m, sizeof(m), bytes.data(), bytes.size(),
               variant == "rendezvous" ? ucx_worker::am_message::protocol::rendezvous
                                       : ucx_worker::am_message::protocol::automatic);
        p.ucx->progress();
      }
      say(awaited_reply(p));
    } else if (command == "release") {
      hold_release m;
      in >> m.lease_id >> m.hold_id >> m.secret;
      std::lock_guard lock(p.ucx->mutex());
      p.send(p.ep, am_hold_release, &m, sizeof(m), nullptr, 0);
      p.ucx->progress();
      say("sent");
    } else if (command == "forge_releases") {
      std::uint64_t lease = 0;
      int n = 0;
      in >> lease >> n;
      std::mt19937_64 gen(7);
      for (int i = 0; i < n; ++i) {
        hold_release m;
        m.lease_id = lease;
        m.hold_id = static_cast<std::uint64_t>(i % 8);
        m.secret = i % 2 == 0 ? 0 : gen();
        std::lock_guard lock(p.ucx->mutex());
        p.send(p.ep, am_hold_release, &m, sizeof(m), nullptr, 0);
        if (i % 64 == 63) p.ucx->progress();
      }
      std::lock_guard lock(p.ucx->mutex());
      p.ucx->progress();
      say("sent");
    } else if (command == "send") {
      unsigned id = 0;
      int reply = 1;
      std::size_t header_bytes = 0;
      std::size_t data_bytes = 0;
      unsigned seed = 0;
      in >> id >> reply >> header_bytes >> data_bytes >> seed;
      const std::vector<unsigned char> bytes =
          testing::pseudo_random(header_bytes + data_bytes, seed);
      ucx_worker::am_message msg;
      msg.id = id;
      msg.bytes.assign(reinterpret_cast<const std::byte*>(bytes.data()),
                       reinterpret_cast<const std::byte*>(bytes.data()) + bytes.size());
      msg.header_bytes = header_bytes;
      msg.reply = reply != 0;
      std::lock_guard lock(p.ucx->mutex());
      (void)p.ucx->send_am(p.ep, std::move(msg));
      p.ucx->progress();
      say("sent");
    } else if (command == "every_id") {
      std::size_t header_bytes = 0;
      std::size_t data_bytes = 0;
      in >> header_bytes >> data_bytes;
      const std::vector<unsigned char> bytes = testing::pseudo_random(header_bytes + data_bytes, 3);
      std::uint64_t n = 0;
      for (unsigned id = 0; id < ucx_worker::max_am_ids; ++id) {
        std::lock_guard lock(p.ucx->mutex());
        p.send(p.ep, id, bytes.data(), header_bytes, bytes.data() + header_bytes, data_bytes);
        ++n;
        if (id % 256 == 255) {
          while (p.ucx->sends_pending() > 64) ucp_worker_progress(p.ucx->worker());
        }
      }
      say("sent " + std::to_string(n));
    } else if (command == "keep_pieces") {
      std::lock_guard lock(p.ucx->mutex());
      p.keep = true;
      say("keeping");
    } else if (command == "stall") {
      std::lock_guard lock(p.ucx->mutex());
      p.ucx->stop();
      say("stalled");
    } else if (command == "listen") {
      in >> p.mode >> p.bytes;
      p.tensor = testing::pseudo_random(p.bytes, 11);
      std::lock_guard lock(p.ucx->mutex());
      absl::StatusOr<std::uint16_t> port = p.ucx->listen("127.0.0.1", 0, &peer::on_connection, &p);
      if (!port.ok()) {
        say("error " + std::string(port.status().message()));
        continue;
      }
      say("listening " + std::to_string(*port));
    } else if (command == "quit") {
      break;
    } else if (!command.empty()) {
      say("error unknown command " + command);
    }
  }
  {
    std::lock_guard lock(p.ucx->mutex());
    p.ucx->finalize();
  }
  work.reset();
  p.io.stop();
  p.runner.join();
  say("bye");
  return 0;
}
