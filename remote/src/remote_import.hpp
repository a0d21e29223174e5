// One remote import (internal): validate, budget, hold, fetch, release,
// land. State changes happen under the node's lock (remote_core.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "asio/steady_timer.hpp"
#include "dlasync/remote/descriptor.hpp"
#include "dlasync/runtime/device_buffer.hpp"
#include "dlasync/transfer/import_options.hpp"
#include "dlasync/transfer/tensor.hpp"
#include "remote/src/plan_remote.hpp"
#include "remote/src/protocol.hpp"

namespace dlasync::detail {

class remote_core;
struct exporter_endpoint;

class remote_import : public std::enable_shared_from_this<remote_import> {
 public:
  using done_fn = absl::AnyInvocable<void(absl::StatusOr<tensor>) &&>;

  remote_import(std::shared_ptr<remote_core> core, done_fn done);
  ~remote_import();

  // Any thread, without the lock.
  void start(const remote_descriptor& d, const import_options& options);
  void cancel(absl::Status why);

  // Under the lock.
  std::uint64_t request_id() const noexcept { return request_id_; }
  void on_hold_reply_locked(const remote_detail::hold_reply& m);
  void on_endpoint_failed_locked(const absl::Status& why);
  void on_fetch_data_locked(const remote_detail::fetch_data& m, void* data, std::size_t length,
                            const ucp_am_recv_param_t* param);

 private:
  enum class fetch_kind : std::uint8_t { whole, runs, span };

  void on_budget(const absl::Status& granted);
  void request_hold_locked();
  void fetch_locked();
  // One piece of the bytes: an RMA get, or a fetch request.
  void get_locked(std::uint64_t remote, void* local, std::uint64_t bytes);
  static void on_get(void* request, ucs_status_t status, void* user_data);
  static void on_received(void* request, ucs_status_t status, std::size_t length, void* user_data);
  void on_get_locked(ucs_status_t status);
  void abandon_pieces_locked();
  void fetched_locked();
  // Sends the release once, when a hold was granted and nothing reads.
  void release_hold_locked();
  // Frees the fetch buffer, the remote key and the request's bookkeeping.
  void cleanup_locked();
  // Completes the handler once; later calls do nothing.
  void finish_locked(absl::StatusOr<tensor> result);
  void land_locally(device_buffer buffer, std::uint64_t budget_bytes);

  std::shared_ptr<remote_core> core_;
  done_fn done_;
  bool finished_ = false;

  remote_descriptor descriptor_;
  import_options options_;
  remote_detail::remote_plan plan_;
  fetch_kind kind_ = fetch_kind::whole;
  device host_;  // where the fetched bytes land first
  std::uint64_t fetch_bytes_ = 0;

  std::uint64_t budget_ticket_ = 0;
  bool waiting_for_budget_ = false;
  std::uint64_t budget_held_ = 0;
  device_buffer buffer_;

  exporter_endpoint* endpoint_ = nullptr;
  ucp_rkey_h rkey_ = nullptr;
  std::uint64_t request_id_ = 0;
  bool hold_requested_ = false;
  bool hold_granted_ = false;
  bool hold_released_ = false;
  std::chrono::steady_clock::time_point sent_;
  std::chrono::steady_clock::time_point hold_end_;
  // RMA gets, or fetch requests (active messages) where the endpoint has no
  // native RMA lane.
  bool rma_ = true;
  struct piece {
    std::uint64_t offset = 0;  // in the buffer
    std::uint64_t length = 0;
    bool done = false;
  };
  std::vector<piece> pieces_;
  std::uint32_t gets_outstanding_ = 0;
  ucs_status_t get_status_ = UCS_OK;
  absl::Status exporter_refusal_;
  // Holds this import alive while UCX owns requests that point at it.
  std::shared_ptr<remote_import> keep_alive_;
  std::unique_ptr<asio::steady_timer> timeout_;
};

}  // namespace dlasync::detail
