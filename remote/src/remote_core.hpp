// The state behind a remote_node (internal): the UCX worker, its listener
// and the importers connected to it, the publications this node exports
// and their holds, the endpoints to exporters and the imports in flight.
//
// One lock. Every UCX call and every piece of state here is guarded by the
// worker's mutex (ucx_worker::mutex()); UCX's callbacks run under it inside
// progress. Nothing that may call back into the node runs under it: producer
// deleters, budget grants and handlers are posted to the runtime's executor
// or run after the lock is dropped.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/status/statusor.h"
#include "asio/any_io_executor.hpp"
#include "asio/cancellation_signal.hpp"
#include "asio/steady_timer.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/producer.hpp"
#include "dlasync/remote.hpp"
#include "dlasync/runtime.hpp"
#include "dlasync/tensor.hpp"
#include "remote/src/plan_remote.hpp"
#include "remote/src/protocol.hpp"
#include "remote/src/recent_map.hpp"
#include "remote/src/registrations.hpp"
#include "remote/src/ucx_error.hpp"
#include "remote/src/ucx_worker.hpp"

namespace dlasync::detail {

// What keeps a published tensor alive: the consumed managed tensor, or a
// reference to an imported tensor.
using published_holder = std::variant<std::monostate, managed_tensor, tensor>;

// Producers whose publications have ended, on their way to their deleters.
// Jobs on the executor drop them; shutdown drops what is still queued itself
// and waits for a drop under way, so that when it returns every producer's
// deleter has run, whether or not the executor still runs jobs. Outlives the
// node in the jobs that hold it.
class retired_producers {
 public:
  // Queues `holders`, and `ended`: the publications' end callbacks, bound to
  // why they ended (remote_node::when_ended), which run after the holders go.
  void add(std::vector<published_holder>& holders, std::vector<std::function<void()>>& ended);
  // Destroys what is queued (the deleters run), then runs the callbacks,
  // outside the lock.
  void drop();
  // drop(), then waits until no other thread is dropping.
  void drop_all();
  // Whether this thread runs deleters or end callbacks in drop() now.
  static bool in_drop() noexcept;

 private:
  std::mutex mutex_;
  std::condition_variable idle_;
  std::vector<published_holder> queued_;
  std::vector<std::function<void()>> ended_;
  int dropping_ = 0;
};

// An importer's connection to this node's listener.
struct importer_connection {
  class remote_core* core = nullptr;
  ucp_ep_h ep = nullptr;
  // Whether its pieces go over shared memory (remote_core::
  // sends_over_memory), once UCX has told: it chooses how strided tensors
  // are sent.
  std::optional<bool> over_memory;
};

// A hold granted to one importer: released only with its secret, on the
// connection it was granted on.
struct hold {
  std::uint64_t secret = 0;
  ucp_ep_h ep = nullptr;
};

// One tensor of a publication: what keeps it alive, its description as
// the exporter made it, and its validation (what the pieces are cut from).
struct published_member {
  published_holder holder;
  remote_descriptor description;
  remote_detail::remote_plan plan;
  std::uint64_t digest = 0;
};

struct publication {
  std::uint64_t lease_id = 0;
  // One tensor, or a bundle's, in the order of their indices.
  std::vector<published_member> members;
  // Between trusted peers: the registrations its members are read under
  // (registration_table).
  std::vector<std::uint64_t> registrations;
  std::uint32_t importers = 1;
  std::uint32_t granted = 0;
  std::uint32_t releases = 0;
  std::uint64_t last_hold = 0;
  std::map<std::uint64_t, hold> holds;  // granted, not released yet
  std::chrono::steady_clock::time_point end;
  std::unique_ptr<asio::steady_timer> timer;
  // Sends (and gathers) that may still read the tensor's memory: a
  // publication that ends meanwhile keeps its holder until they are over,
  // or until its lease ends, when the connections still reading are
  // closed (readers: the sends in flight on each).
  std::uint32_t reads_in_flight = 0;
  std::map<ucp_ep_h, std::uint32_t> readers;
  // Called once when it ends (remote_node::when_ended).
  std::vector<std::function<void(publication_end)>> on_end;
};

// A remote key unpacked on an endpoint to an exporter (trusted peers):
// shared by the endpoint's cache and the imports whose gets use it, and
// destroyed when the last lets it go, unless the worker (whose memory it
// lives in) is gone already.
struct unpacked_key {
  unpacked_key(ucx_worker& ucx, ucp_rkey_h handle) noexcept : ucx(ucx), handle(handle) {}
  unpacked_key(const unpacked_key&) = delete;
  unpacked_key& operator=(const unpacked_key&) = delete;
  ~unpacked_key() {
    if (!ucx.finalized()) ucp_rkey_destroy(handle);
  }
  ucx_worker& ucx;
  ucp_rkey_h handle;
};

// An endpoint to one exporter's listener, shared by the imports from it.
struct exporter_endpoint {
  // The most remote keys kept unpacked per endpoint.
  static constexpr std::size_t max_keys = 64;
  class remote_core* core = nullptr;
  std::string key;  // "address port"
  ucp_ep_h ep = nullptr;
  absl::Status failure;  // set once UCX reported the peer lost, or it went silent
  // When the exporter was last heard from on this endpoint (a reply, a
  // piece, a piece's bytes arriving), or the endpoint was made.
  std::chrono::steady_clock::time_point heard = std::chrono::steady_clock::now();
  // Whether UCX made the connection (its first flush completed), or the
  // exporter answered on it: only then can a close flush what was sent.
  bool connected = false;
  void heard_from() {
    heard = std::chrono::steady_clock::now();
    connected = true;
  }
  // The imports that asked for a hold on it (they fail when it is lost).
  std::vector<std::weak_ptr<class remote_import>> users;
  // The flush made with the endpoint, until it completes: then UCX has
  // wired the endpoint up (or failed to). Only then does its lane report say
  // whether UCX gets bytes with a native RMA lane (cma over shared memory)
  // rather than emulating RMA with active messages; imports that need the
  // answer (trusted peers, fetch automatic) wait in `awaiting_wireup`.
  void* wiring = nullptr;
  bool wired() const noexcept { return wiring == nullptr; }
  std::vector<std::weak_ptr<class remote_import>> awaiting_wireup;
  // Remote keys unpacked on `ep`, by their packed bytes: imports of memory
  // an exporter keeps registered unpack its key once (trusted peers). The
  // least recently used goes first.
  remote_detail::recent_map<std::shared_ptr<unpacked_key>> keys{max_keys};
};

class remote_core : public std::enable_shared_from_this<remote_core> {
 public:
  remote_core(runtime& rt, remote_node_options options, std::shared_ptr<ucx_worker> ucx);
  ~remote_core();

  runtime& rt() noexcept { return rt_; }
  asio::any_io_executor executor() const { return executor_; }
  const remote_node_options& options() const noexcept { return options_; }
  ucx_worker& ucx() noexcept { return *ucx_; }

  // Registers the active-message handlers, listens, and starts progress.
  absl::Status start();
  void shutdown();
  bool stopping() const noexcept { return stopping_; }

  // Exporting (exporter.cpp).
  // Fills in each member's exporter and lease (and, for one tensor that is
  // no bundle, between trusted peers, its key), validates it, and keeps the
  // members' holders (moved from only on success) until the lease ends.
  // Returns the members' descriptions, completed. A refusal of a bundle's
  // member names it.
  absl::StatusOr<std::vector<remote_descriptor>> publish(std::vector<published_member>& members,
                                                         bool bundle,
                                                         const publish_options& options);
  std::size_t publications() const;
  // remote_node::register_memory, and its handle's end (remote_registration).
  absl::StatusOr<std::uint64_t> register_memory(std::uint64_t begin, std::uint64_t bytes);
  void unregister_memory(std::uint64_t id);
  // Registrations held (users' and publications'), and those made since
  // the node started.
  std::size_t registrations() const;
  std::uint64_t registrations_made() const;
  // remote_node::when_ended.
  absl::Status when_ended(std::uint64_t lease_id, std::function<void(publication_end)> callback);
  std::size_t connections() const;
  const std::string& listen_address() const noexcept { return listen_address_; }
  const std::string& advertised_address() const noexcept { return advertised_address_; }
  std::uint16_t listen_port() const noexcept { return listen_port_; }

  // Importing (remote_import.cpp). Require the lock.
  absl::StatusOr<exporter_endpoint*> endpoint_locked(const std::string& address,
                                                     std::uint16_t port);
  std::uint64_t next_request_id_locked() { return ++last_request_id_; }
  void track_locked(const std::shared_ptr<remote_import>& op);
  void untrack_locked(std::uint64_t request_id);
  // `e` is lost (UCX said so, or the exporter went silent): its imports fail
  // with `why`, it leaves the cache (the next import reconnects) and is
  // closed. `from_ucx`: inside UCX's callback, where it may not be closed.
  void endpoint_lost_locked(exporter_endpoint& e, absl::Status why, bool from_ucx);
  std::size_t imports_in_flight() const;
  remote_import_counts imports_completed() const;
  // An import completed with its tensors: read by RMA, sent by the
  // exporter, or with no bytes to move.
  void count_completed_locked(bool by_rma, bool any_bytes) noexcept {
    ++(!any_bytes ? completed_.without_bytes
       : by_rma   ? completed_.read_by_rma
                  : completed_.sent_by_exporter);
  }
  // Whether UCX reads over `ep` with a native RMA lane (cma over shared
  // memory) rather than emulating RMA with active messages.
  static bool native_rma(ucp_ep_h ep);
  // Whether the active messages sent over `ep` go over shared memory only
  // (true) or over a network (false); nullopt while UCX reports no lanes
  // for them yet (not wired up).
  static std::optional<bool> sends_over_memory(ucp_ep_h ep);

  // Sends a small active message on `ep` (with a reply endpoint), fire and
  // forget; the header (and `data`, with the message) is copied and kept
  // until UCX is done with it. Requires the lock.
  void send_locked(ucp_ep_h ep, unsigned id, const void* header, std::size_t length,
                   std::string_view data = {});

 private:
  static ucs_status_t on_am_request(void* arg, const void* header, std::size_t length, void* data,
                                    std::size_t data_length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_reply(void* arg, const void* header, std::size_t length, void* data,
                                  std::size_t data_length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_release(void* arg, const void* header, std::size_t length, void* data,
                                    std::size_t data_length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_piece(void* arg, const void* header, std::size_t length, void* data,
                                  std::size_t data_length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_packed(void* arg, const void* header, std::size_t length, void* data,
                                   std::size_t data_length, const ucp_am_recv_param_t* param);
  static void on_connection_request(ucp_conn_request_h request, void* arg);
  static void on_importer_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void on_exporter_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  // An endpoint's flush completed (`request`, its `wiring`): it is wired
  // up, and the imports that waited for it go on.
  static void on_wired(void* request, ucs_status_t status, void* arg);
  void wired_locked(exporter_endpoint& e);

  // The importer connected on `ep`, or null: a message from anywhere else
  // is not an importer's.
  importer_connection* importer_locked(ucp_ep_h ep);

  // Exporting (exporter.cpp).
  // `members`: the request's list (request_members), as received.
  // The runs sent piece by piece to the importer on `ep` (else a gathered
  // copy): remote_node_options::min_run_bytes and up, or, by default, as
  // measured for its connection's transport.
  struct run_range {
    std::uint64_t least;
    std::uint64_t most;
  };
  run_range sent_runs_locked(ucp_ep_h ep);
  void on_hold_request_locked(const remote_detail::hold_request& m, const void* members,
                              std::size_t members_bytes, ucp_ep_h ep);
  // The members a hold request asks for (indices into pub.members), or
  // why it is refused.
  absl::StatusOr<std::vector<std::uint32_t>> asked_members(const remote_detail::hold_request& m,
                                                           const publication& pub,
                                                           const void* members,
                                                           std::size_t members_bytes) const;
  void on_hold_release_locked(const remote_detail::hold_release& m, ucp_ep_h ep);
  // A hold for the importer on `ep`: its id and secret, in `r`.
  void grant_hold_locked(publication& pub, remote_detail::hold_reply& r, ucp_ep_h ep);
  // Grants a bundle's members `asked` (sent as `walks` cut them): the grant
  // carries each member's plan; small members go packed, in the grant itself
  // when all fit and the importer offered to take them so (the hold ends
  // then).
  void grant_bundle_locked(std::map<std::uint64_t, publication>::iterator it,
                           remote_detail::hold_reply& r, const remote_detail::hold_request& m,
                           const std::vector<std::uint32_t>& asked,
                           const std::vector<remote_detail::piece_walk>& walks, ucp_ep_h ep);
  // Sends `bytes` (a header of `header_bytes`, then data) eagerly on `ep`.
  void send_built_locked(ucp_ep_h ep, unsigned id, std::vector<std::byte> bytes,
                         std::size_t header_bytes);
  // Sends pub.members[index]'s bytes as `walk` cuts them, as the member at
  // `place` of request `request_id`.
  void send_member_locked(publication& pub, std::uint32_t index, std::uint32_t place,
                          std::uint64_t request_id, ucp_ep_h ep,
                          const remote_detail::piece_walk& walk);
  // A compact copy of the member's tensor, made by the runtime and sent in
  // its `pieces` when it is made.
  void send_gathered_locked(publication& pub, std::uint32_t index, std::uint32_t place,
                            std::uint64_t pieces, std::uint64_t request_id, ucp_ep_h ep);
  // Where a gathered copy goes: the request, the member's place, the
  // importer's connection.
  struct gather_target {
    std::uint64_t lease = 0;
    std::uint64_t bytes = 0;
    std::uint64_t pieces = 0;  // the copy's, as the member's walk cuts it
    std::uint64_t request_id = 0;
    std::uint32_t place = 0;
    ucp_ep_h ep = nullptr;
  };
  // A compact copy of the published tensor `view`, sent in pieces of
  // max_piece_bytes when it is made. On the executor, without the node's
  // lock.
  void gather(tensor_description view, gather_target to);
  void cancel_gathers_locked();
  // Until every gather's handler has run. Without the node's lock.
  void wait_for_gathers();
  // Grants a hold whose only piece (`range`) goes as the grant's data, and
  // ends the hold at once (hold_request's request_bytes_with_grant).
  void grant_with_bytes_locked(std::map<std::uint64_t, publication>::iterator it,
                               remote_detail::hold_reply& r,
                               const remote_detail::piece_range& range, ucp_ep_h ep);
  // An active message of the protocol, `header` then `length` bytes at
  // `data` (eagerly up to 64 KiB); `done` runs once UCX no longer reads them.
  void send_with_data_locked(ucp_ep_h ep, unsigned id, const void* header, std::size_t header_bytes,
                             const void* data, std::uint64_t length, ucx_worker::send_done done);
  // The same with `range` of `pub`'s memory as the data: a read of the
  // publication until the send is over (on_read_done_locked).
  void send_read_locked(publication& pub, ucp_ep_h ep, unsigned id, const void* header,
                        std::size_t header_bytes, const remote_detail::piece_range& range);
  void send_refusal_locked(const gather_target& to, absl::StatusCode code);
  // A read of the publication's memory is over: a send on `ep`, or a
  // gather (null).
  void on_read_done_locked(std::uint64_t lease_id, ucp_ep_h ep = nullptr);
  // Closes the connection of an importer: its holds end.
  void close_importer_locked(ucp_ep_h ep);
  // Ends hold `h`, and counts it released.
  void release_hold_locked(std::map<std::uint64_t, publication>::iterator it,
                           std::map<std::uint64_t, hold>::iterator h);
  // Counts a hold as released; ends the publication after its last one.
  void count_release_locked(std::map<std::uint64_t, publication>::iterator it);
  // The connection on `ep` is gone: its holds are released.
  void drop_importer_locked(ucp_ep_h ep);
  void expire(std::uint64_t lease_id);
  // Unregisters and forgets a publication; its holder goes to `retired_`,
  // or it waits in `draining_` while reads of its memory are under way. Its
  // end callbacks go to `ended_`, bound to `why`.
  void retire_locked(std::map<std::uint64_t, publication>::iterator it, publication_end why);
  // Moves the publication's holders to `retired_`.
  void retire_holders_locked(publication& pub);
  // Destroys retired holders (producer deleters) on the executor, through
  // `to_delete_`.
  void drop_retired_locked();

  void close_endpoint_locked(exporter_endpoint& e);

  runtime& rt_;
  const remote_node_options options_;
  std::shared_ptr<ucx_worker> ucx_;
  asio::any_io_executor executor_;
  bool stopping_ = false;
  // Shutdown's end, for a second caller to wait for (under the mutex).
  bool shut_down_ = false;
  std::condition_variable shutdown_finished_;
  std::string listen_address_;
  std::string advertised_address_;  // what descriptors name
  std::uint16_t listen_port_ = 0;

  // Memory registered for RMA (trusted peers only).
  registration_table registrations_;
  std::map<std::uint64_t, publication> publications_;
  // Ended publications whose memory sends still read.
  std::map<std::uint64_t, publication> draining_;
  std::vector<published_holder> retired_;
  std::vector<std::function<void()>> ended_;
  std::shared_ptr<retired_producers> to_delete_ = std::make_shared<retired_producers>();
  std::unordered_map<ucp_ep_h, std::unique_ptr<importer_connection>> importers_;
  // Gathers under way (local imports that read a publication's memory),
  // each with the signal that cancels it. Its own lock, taken after the
  // node's: a gather starts without the node's lock.
  std::mutex gathers_mutex_;
  std::condition_variable gathers_done_;
  std::list<asio::cancellation_signal> gathers_;

  std::uint64_t last_request_id_ = 0;
  std::unordered_map<std::string, std::unique_ptr<exporter_endpoint>> endpoints_;
  std::vector<std::unique_ptr<exporter_endpoint>> failed_endpoints_;
  std::unordered_map<std::uint64_t, std::shared_ptr<remote_import>> imports_;
  remote_import_counts completed_;
};

// The import's operation on `core` (remote_import.cpp); the initiating
// functions reach it through make_remote_import(remote_node&, ...).
std::shared_ptr<remote_import> make_remote_import(remote_core& core);

}  // namespace dlasync::detail
