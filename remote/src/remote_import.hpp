// One remote import (internal): validate, budget, hold, bytes, release,
// land. State changes happen under the node's lock (remote_core.hpp).
//
// The bytes arrive as pieces the exporter sends (remote_fetch.cpp checks
// each against the descriptor before it writes a byte), or, between
// trusted peers, by RMA gets this import issues. Either way UCX writes into
// the members' buffers until `writes_in_flight_` is 0: the buffers and their
// budget are let go only then, or when the worker ends at shutdown.
//
// A bundle is one import of several members: one budget for all, one hold,
// one release, every member's pieces in flight together.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "asio/steady_timer.hpp"
#include "dlasync/device_buffer.hpp"
#include "dlasync/import_options.hpp"
#include "dlasync/remote.hpp"
#include "dlasync/tensor.hpp"
#include "remote/src/plan_remote.hpp"
#include "remote/src/protocol.hpp"
#include "runtime/src/budget_wait.hpp"

namespace dlasync::detail {

class remote_core;
struct exporter_endpoint;
struct unpacked_key;

// A status code from a peer: one absl knows, else Unknown.
absl::StatusCode peer_code(std::int32_t code);

class remote_import : public std::enable_shared_from_this<remote_import> {
 public:
  // One tensor per member, in order.
  using done_fn = absl::AnyInvocable<void(absl::StatusOr<std::vector<tensor>>) &&>;

  explicit remote_import(std::shared_ptr<remote_core> core);
  ~remote_import();

  // Any thread, without the lock. One tensor, or a bundle's members (one
  // hold for all).
  void start(absl::AnyInvocable<void(absl::StatusOr<tensor>) &&> done, const remote_descriptor& d,
             const import_options& options);
  void start(done_fn done, const remote_bundle& b, const import_options& options);
  void cancel(absl::Status why);
  // The import timeout expired after `t`: ends this import, or, when nothing
  // came from the exporter meanwhile, the whole connection to it.
  void timed_out(std::chrono::milliseconds t);

  // Under the lock.
  std::uint64_t request_id() const noexcept { return request_id_; }
  // With the message's data (a grant's bytes, reply_bytes_with_grant), from
  // the endpoint `param` names.
  void on_hold_reply_locked(const remote_detail::hold_reply& m, void* data, std::size_t length,
                            const ucp_am_recv_param_t* param);
  void on_piece_locked(const remote_detail::piece& m, void* data, std::size_t length,
                       const ucp_am_recv_param_t* param);
  // Small members packed in one message.
  void on_packed_locked(const remote_detail::packed& m, void* data, std::size_t length,
                        const ucp_am_recv_param_t* param);
  void on_endpoint_failed_locked(const absl::Status& why);
  // The endpoint this import waited for is wired up: its fetch is chosen.
  void on_wired_locked();
  // The node shuts down: the handler gets Cancelled now; the buffer and the
  // budget go in after_finalize_locked, once the worker (and every write it
  // could still make) is gone.
  void on_shutdown_locked();
  void after_finalize_locked();
  // Whether UCX may still write into the buffer.
  bool writing() const noexcept { return writes_in_flight_ > 0 || rma_issuing_; }

 private:
  // What lands in a member's buffer: the compact row-major bytes, or the
  // span the strides reach (compacted here afterwards).
  enum class layout : std::uint8_t { compact, span };

  // One tensor of the import, with its own buffer and pieces.
  struct member {
    std::uint32_t index = 0;  // in the published bundle
    remote_descriptor descriptor;
    remote_detail::remote_plan plan;
    layout lands = layout::compact;
    std::uint64_t fetch_bytes = 0;
    device_buffer buffer;
    std::optional<remote_detail::piece_walk> walk;
    std::vector<bool> piece_seen;
  };

  // Validates the members (each as one descriptor), then connects and asks
  // for the budget.
  // `refused`: the bundle's framing was refused already.
  void begin(done_fn done, std::vector<member> members, bool bundle, const import_options& options,
             absl::Status refused = absl::OkStatus());
  // "lease L", or "member I of lease L" in a bundle: what messages name.
  std::string name_of(std::size_t k) const;
  // Chooses how each member's bytes come, and how many bytes the members'
  // buffers take (fetch_bytes_), within the budget's limit. `unwired`: the
  // choice needs the endpoint wired up, and nothing was chosen.
  absl::Status plan_fetch_locked(bool& unwired);
  // Takes the budget for fetch_bytes_, or waits for it.
  void ask_budget_locked();
  void on_budget(const absl::Status& granted);
  // The budget is held (budget_held_): allocates and asks for the hold.
  void budget_granted_locked();
  void request_hold_locked();
  // The exporter's plan for member k's bytes, from its grant: false when
  // it does not fit the member's descriptor.
  bool adopt_plan_locked(std::size_t k, std::uint8_t plan, std::uint64_t count);
  // A bundle's grant: every member's plan, from the grant's data.
  bool adopt_plans_locked(const void* data, std::size_t length);
  // A bundle's grant was granted (remote_fetch.cpp): its data is each
  // member's plan, then, `with_bytes`, every member packed.
  void on_bundle_grant_locked(bool with_bytes, void* data, std::size_t length,
                              const ucp_am_recv_param_t* param);
  // A packed message's data (remote_fetch.cpp): each member's piece checked
  // and written. `whole`: the grant carries them, and they must be every
  // member's bytes.
  void unpack_locked(const remote_detail::packed& h, const unsigned char* data, std::size_t length,
                     bool whole);
  // How each member's bytes come (remote_fetch.cpp): sets rma_ (one way
  // for all), and each member's choice in `choices`. A refusal (RMA forced
  // on a member without a key) names the member.
  // `unwired`: it asked for the endpoint's lanes before UCX wired it up.
  absl::Status choose_fetch_locked(std::vector<remote_detail::fetch_choice>& choices,
                                   bool& unwired);
  // RMA (trusted peers): the gets this import issues (remote_fetch.cpp),
  // for every member, under its key.
  void fetch_rma_locked();
  // A bundle's grant for RMA: a plan of none for every member and no
  // bytes (DataLoss otherwise), then the gets.
  void on_rma_bundle_grant_locked(bool with_bytes, const void* data, std::size_t length,
                                  bool in_place);
  // The key `packed` unpacked on the endpoint: from its cache, or unpacked
  // now (and kept there); this import holds it until nothing writes.
  absl::StatusOr<ucp_rkey_h> key_locked(const std::string& packed);
  // Forgets, one import_timeout from now, an ended import whose hold
  // request was never answered.
  void forget_locked();
  // Leaves the node's table (answers to it are dropped from then on).
  void untrack_locked();
  void get_locked(ucp_rkey_h key, std::uint64_t remote, void* local, std::uint64_t bytes);
  static void on_get(void* request, ucs_status_t status, void* user_data);
  static void on_received(void* request, ucs_status_t status, std::size_t length, void* user_data);
  // A write into the buffer is over (an RMA get or a piece's rendezvous).
  void write_done_locked(ucs_status_t status);
  // Goes on once every byte is in; or frees what is left after a failure.
  void advance_locked();
  void fetched_locked();
  // Member k's fetched bytes, owned by a buffer that returns their budget.
  device_buffer owned_locked(member& m);
  // A landed member; the handler gets every tensor after the last.
  void landed_locked(std::size_t k, absl::StatusOr<tensor> t);
  // Ends the import with `why` (consumed) unless it ended already, then
  // winds it down.
  void fail_locked(absl::Status why);
  // After the handler has its result: the import leaves the node's table
  // (unless a hold's answer is still to come, which releases it), its hold
  // is released, and what nothing writes any more is freed.
  void wind_down_locked();
  // Sends the release once, when a hold was granted.
  void release_hold_locked();
  // Frees the buffer, the budget and the remote key once nothing writes.
  void cleanup_locked();
  // Completes the handler once; later calls do nothing.
  void finish_locked(absl::StatusOr<std::vector<tensor>> result);
  void land_locally(std::size_t k, device_buffer buffer);

  std::shared_ptr<remote_core> core_;
  done_fn done_;  // set by start
  bool finished_ = false;
  // The result of a cancel that came before start, which start delivers.
  std::optional<absl::StatusOr<std::vector<tensor>>> unstarted_result_;

  std::vector<member> members_;
  bool bundle_ = false;  // asked for with a member list
  std::uint64_t lease_id_ = 0;
  import_options options_;
  device host_;                    // where the fetched bytes land first
  std::uint64_t fetch_bytes_ = 0;  // all members'
  // Landed members, when some land by a local import.
  std::vector<tensor> landed_;
  std::size_t landing_ = 0;

  budget_wait budget_wait_;
  bool budget_taken_ = false;  // a grant on its way that shutdown settled
  std::uint64_t budget_held_ = 0;

  exporter_endpoint* endpoint_ = nullptr;
  bool awaiting_wireup_ = false;  // on endpoint_->awaiting_wireup
  std::uint64_t request_id_ = 0;
  bool tracked_ = false;
  bool hold_requested_ = false;
  bool reply_seen_ = false;
  bool hold_granted_ = false;
  bool hold_released_ = false;
  std::uint64_t hold_id_ = 0;
  std::uint64_t secret_ = 0;
  std::chrono::steady_clock::time_point sent_;
  std::chrono::steady_clock::time_point hold_end_;

  // RMA gets (trusted peers), or pieces the exporter sends.
  bool rma_ = false;
  std::vector<std::shared_ptr<unpacked_key>> keys_;  // the members' keys
  bool rma_issuing_ = false;
  std::uint64_t rma_pending_ = 0;
  // Pieces of every member: expected (the plans' sum), and written.
  std::uint64_t pieces_expected_ = 0;
  std::uint64_t pieces_done_ = 0;
  std::size_t plans_adopted_ = 0;
  // Writes UCX may still make into the members' buffers.
  std::uint64_t writes_in_flight_ = 0;
  absl::Status failure_;
  // Holds this import alive while UCX owns requests that point at it.
  std::shared_ptr<remote_import> keep_alive_;
  std::unique_ptr<asio::steady_timer> timeout_;
  // An import that ended with its hold request unanswered stays tracked
  // (an answer that comes releases the hold) for one more import_timeout,
  // then is forgotten.
  std::unique_ptr<asio::steady_timer> forget_;
};

}  // namespace dlasync::detail
