// The state behind a remote_node (internal): the UCX worker, the
// publications this node exports, the endpoints to exporters and the
// imports in flight.
//
// One lock. Every UCX call and every piece of state here is guarded by the
// worker's mutex (ucx_worker::mutex()); UCX's callbacks run under it inside
// progress. Nothing that may call back into the node runs under it: producer
// deleters, budget grants and handlers are posted to the runtime's executor
// or run after the lock is dropped.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/status/statusor.h"
#include "asio/any_io_executor.hpp"
#include "asio/steady_timer.hpp"
#include "dlasync/remote/descriptor.hpp"
#include "dlasync/remote/node.hpp"
#include "dlasync/remote/ucx_worker.hpp"
#include "dlasync/runtime/runtime.hpp"
#include "dlasync/transfer/managed_tensor.hpp"
#include "dlasync/transfer/tensor.hpp"
#include "remote/src/protocol.hpp"
#include "remote/src/ucx_error.hpp"

namespace dlasync::detail {

// What keeps a published tensor alive: the consumed managed tensor, or a
// reference to an imported tensor.
using published_holder = std::variant<std::monostate, managed_tensor, tensor>;

struct publication {
  std::uint64_t lease_id = 0;
  published_holder holder;
  ucp_mem_h memh = nullptr;
  std::uint32_t importers = 1;
  std::uint32_t holds = 0;
  std::uint32_t releases = 0;
  std::chrono::steady_clock::time_point end;
  std::unique_ptr<asio::steady_timer> timer;
  // The registered region, which fetch requests must stay inside.
  std::uint64_t region_begin = 0;
  std::uint64_t region_bytes = 0;
  // fetch_data messages UCX may still read the tensor's memory for: a
  // publication that ends meanwhile keeps its holder until they complete.
  std::uint32_t sends_in_flight = 0;
};

// An endpoint to one exporter, shared by the imports from it.
struct exporter_endpoint {
  class remote_core* core = nullptr;
  std::string address;
  ucp_ep_h ep = nullptr;
  absl::Status failure;  // set once UCX reported the peer lost
  // Whether UCX reports a lost peer on this endpoint (not over shared
  // memory alone).
  bool detects_failure = true;
  // Whether UCX gets bytes over this endpoint with a native RMA lane (cma
  // over shared memory), rather than emulating it with active messages.
  bool native_rma = false;
  std::vector<std::weak_ptr<class remote_import>> users;
};

class remote_core : public std::enable_shared_from_this<remote_core> {
 public:
  remote_core(runtime& rt, remote_node_options options, std::shared_ptr<ucx_worker> ucx);
  ~remote_core();

  runtime& rt() noexcept { return rt_; }
  asio::any_io_executor executor() const { return executor_; }
  const remote_node_options& options() const noexcept { return options_; }
  ucx_worker& ucx() noexcept { return *ucx_; }

  // Registers the active-message handlers and starts progress.
  absl::Status start();
  void shutdown();
  bool stopping() const noexcept { return stopping_; }

  // Exporting (exporter.cpp).
  // Registers d's region, fills in its key, address and lease, and keeps
  // `holder` (moved from only on success) until the lease ends. `d` is
  // already validated.
  absl::StatusOr<remote_descriptor> publish(published_holder& holder, remote_descriptor d,
                                            const publish_options& options);
  std::size_t publications() const;

  // Importing (remote_import.cpp). Require the lock.
  absl::StatusOr<exporter_endpoint*> endpoint_locked(const std::string& address);
  std::uint64_t next_request_id_locked() { return ++last_request_id_; }
  void track_locked(const std::shared_ptr<remote_import>& op);
  void untrack_locked(std::uint64_t request_id);
  std::size_t imports_in_flight() const;

  // Sends a small active message on `ep`, fire and forget; the header is
  // copied and kept until UCX is done with it. Requires the lock.
  void send_locked(ucp_ep_h ep, unsigned id, const void* header, std::size_t length, bool reply);

 private:
  static ucs_status_t on_am_request(void* arg, const void* header, std::size_t length, void* data,
                                    std::size_t data_length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_reply(void* arg, const void* header, std::size_t length, void* data,
                                  std::size_t data_length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_release(void* arg, const void* header, std::size_t length, void* data,
                                    std::size_t data_length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_fetch_request(void* arg, const void* header, std::size_t length,
                                          void* data, std::size_t data_length,
                                          const ucp_am_recv_param_t* param);
  static ucs_status_t on_am_fetch_data(void* arg, const void* header, std::size_t length,
                                       void* data, std::size_t data_length,
                                       const ucp_am_recv_param_t* param);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  void on_hold_request_locked(const remote_detail::hold_request& m, ucp_ep_h reply_ep);
  void on_hold_release_locked(const remote_detail::hold_release& m);
  void on_hold_reply_locked(const remote_detail::hold_reply& m);
  void on_fetch_request_locked(const remote_detail::fetch_request& m, ucp_ep_h reply_ep);
  void on_fetch_sent_locked(std::uint64_t lease_id);
  void expire(std::uint64_t lease_id);
  // Unregisters and forgets a publication; its holder goes to `retired_`,
  // or it waits in `draining_` while sends still read its memory.
  void retire_locked(std::map<std::uint64_t, publication>::iterator it);
  // Destroys retired holders (producer deleters) on the executor.
  void drop_retired_locked();
  void close_endpoint_locked(exporter_endpoint& e);

  runtime& rt_;
  const remote_node_options options_;
  std::shared_ptr<ucx_worker> ucx_;
  asio::any_io_executor executor_;
  bool stopping_ = false;

  std::uint64_t lease_seed_ = 0;
  std::uint64_t last_lease_ = 0;
  std::map<std::uint64_t, publication> publications_;
  // Ended publications whose memory fetch_data sends still read.
  std::map<std::uint64_t, publication> draining_;
  std::vector<published_holder> retired_;

  std::uint64_t last_request_id_ = 0;
  std::unordered_map<std::string, std::unique_ptr<exporter_endpoint>> endpoints_;
  std::vector<std::unique_ptr<exporter_endpoint>> failed_endpoints_;
  std::unordered_map<std::uint64_t, std::shared_ptr<remote_import>> imports_;
};

}  // namespace dlasync::detail
