#include "kserve_service.hpp"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kserve_grpc.hpp"

namespace dlasync::examples::kserve {

asio::awaitable<absl::Status> message_server::answer(
    const inference::ModelInferRequest& request, const std::shared_ptr<void>& owner,
    inference::ModelInferResponse& response) const {
  absl::StatusOr<infer_request> parsed = from_message(request, owner, budget);
  if (!parsed.ok()) co_return parsed.status();
  const absl::Status read = read_inputs(*parsed, shm, budget, pool);
  if (!read.ok()) co_return read;
  absl::StatusOr<infer_response> answered = co_await models.infer(*std::move(parsed));
  if (!answered.ok()) co_return answered.status();
  const absl::Status written = write_outputs(*answered, shm);
  if (!written.ok()) co_return written;
  to_message(*answered, response);
  co_return absl::OkStatus();
}

asio::awaitable<absl::StatusOr<std::string>> message_server::answer_serialized(
    std::unique_ptr<std::byte[]> bytes, std::size_t length, std::shared_ptr<void> room) const {
  // The parsed message holds the bytes' room in the budget until the last
  // tensor viewing its raw contents is released.
  struct held {
    inference::ModelInferRequest request;
    std::shared_ptr<void> room;
  };
  auto message = std::make_shared<held>();
  message->room = std::move(room);
  if (length > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !message->request.ParseFromArray(bytes.get(), static_cast<int>(length))) {
    co_return absl::InvalidArgumentError(absl::StrCat(
        "the request's ", length,
        " bytes are not a ModelInferRequest (grpc_service.proto, inference package): send one "
        "serialized message"));
  }
  bytes.reset();
  inference::ModelInferResponse response;
  // The request's fields outlive every view of them: `owner` shares `message`.
  const std::shared_ptr<void> owner(message, &message->request);
  const absl::Status s = co_await answer(message->request, owner, response);
  if (!s.ok()) co_return s;
  co_return response.SerializeAsString();
}

}  // namespace dlasync::examples::kserve
