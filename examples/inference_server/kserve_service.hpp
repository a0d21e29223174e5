// What answers an inference request message (grpc_service.proto's
// ModelInferRequest), whichever transport carried it: the gRPC front, and
// the UCX transport, which carries the same messages serialized. One path
// from the message to its response: the inputs taken (kserve_grpc.hpp),
// read from shared memory where they name a region (shm_registry.hpp), the
// model run (kserve_models.hpp), the outputs written.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "asio/awaitable.hpp"
#include "buffer_pool.hpp"
#include "dlasync/dlasync.hpp"
#include "grpc_service.pb.h"
#include "kserve_models.hpp"
#include "shm_registry.hpp"

namespace dlasync::examples::kserve {

// A serialized message as a transport received it: its bytes in one or
// more pieces (in order), and their owner.
struct serialized_message {
  std::vector<std::span<const std::byte>> pieces;
  std::shared_ptr<const void> owner;
  // The numeric address of the host that sent it (a remote bundle must
  // come from there); empty where the transport does not say.
  std::string peer;

  // One buffer of `length` bytes, which the message then owns.
  static serialized_message of(std::unique_ptr<std::byte[]> bytes, std::size_t length);
  std::size_t length() const noexcept;
};

// Fetches the members of a request's remote bundle that its inputs name
// (remote_inputs.hpp, over dlasync::remote), so that they are the inputs'
// bytes.
class bundle_fetcher {
 public:
  virtual ~bundle_fetcher() = default;
  // Gives each input of `r` that names a member of r.bundle its bytes and
  // their owner. `peer` is the numeric address of the host the request
  // came from.
  virtual asio::awaitable<absl::Status> fetch(infer_request& r, std::string peer) = 0;
};

struct message_server {
  model_handler& models;
  const shm_registry& shm;
  memory_budget& budget;
  buffer_pool& pool;
  // Where inputs named in a remote bundle come from; none: such requests
  // are refused (PermissionDenied).
  bundle_fetcher* bundles = nullptr;

  // The answer to `request` in `response`: its inputs taken (from_message),
  // read from shared memory and fetched from their remote bundle, the model
  // run, the outputs that name a region written there. `owner` keeps
  // `request` alive while a tensor views its raw contents; `peer` is the
  // host it came from. The errors of from_message, read_inputs,
  // bundle_fetcher::fetch, the model (model_handler::infer) and
  // write_outputs.
  asio::awaitable<absl::Status> answer(const inference::ModelInferRequest& request,
                                       const std::shared_ptr<void>& owner, std::string peer,
                                       inference::ModelInferResponse& response) const;

  // The answer to a serialized ModelInferRequest, serialized: the UCX
  // transport's and the gRPC front's. `m`'s pieces are let go of once
  // parsed; `room`, the message's share of the budget, stays held for the
  // parsed message until the last tensor that views it is released.
  //   InvalidArgument  bytes that are not a ModelInferRequest, or hold
  //                    fields it does not have (parsed_bytes_bound);
  //   ResourceExhausted  a message whose parsed form would take more than
  //                    twice its bytes, with no room in the budget for the
  //                    rest now;
  //   what answer() says.
  asio::awaitable<absl::StatusOr<std::string>> answer_serialized(serialized_message m,
                                                                 std::shared_ptr<void> room) const;
};

}  // namespace dlasync::examples::kserve
