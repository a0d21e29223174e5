#include "kserve_service.hpp"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kserve_grpc.hpp"

namespace dlasync::examples::kserve {
namespace {

// `m`'s bytes parsed into `request`; false where they are not one.
bool parse(const serialized_message& m, inference::ModelInferRequest& request) {
  if (m.pieces.size() <= 1) {
    const std::span<const std::byte> one =
        m.pieces.empty() ? std::span<const std::byte>() : m.pieces[0];
    return request.ParseFromArray(one.data(), static_cast<int>(one.size()));
  }
  joined_pieces joined(m.pieces);
  return request.ParseFromZeroCopyStream(&joined.stream());
}

}  // namespace

asio::awaitable<absl::Status> message_server::answer(
    const inference::ModelInferRequest& request, const std::shared_ptr<void>& owner,
    std::string peer, inference::ModelInferResponse& response) const {
  absl::StatusOr<infer_request> parsed = from_message(request, owner, budget);
  if (!parsed.ok()) co_return parsed.status();
  const absl::Status read = read_inputs(*parsed, shm, budget, pool);
  if (!read.ok()) co_return read;
  if (!parsed->bundle.empty()) {
    if (bundles == nullptr) {
      co_return absl::PermissionDeniedError(
          "the request names a remote bundle (dlasync_bundle), which this server does not fetch "
          "here: send it over the UCX transport of a server started with --allow_remote_inputs, "
          "or send the bytes in the request");
    }
    const absl::Status fetched = co_await bundles->fetch(*parsed, std::move(peer));
    if (!fetched.ok()) co_return fetched;
  }
  absl::StatusOr<infer_response> answered = co_await models.infer(*std::move(parsed));
  if (!answered.ok()) co_return answered.status();
  const absl::Status written = write_outputs(*answered, shm);
  if (!written.ok()) co_return written;
  to_message(*answered, response);
  co_return absl::OkStatus();
}

serialized_message serialized_message::of(std::unique_ptr<std::byte[]> bytes, std::size_t length) {
  serialized_message m;
  m.pieces.emplace_back(bytes.get(), length);
  m.owner = std::shared_ptr<const std::byte[]>(std::move(bytes));
  return m;
}

std::size_t serialized_message::length() const noexcept {
  std::size_t n = 0;
  for (const std::span<const std::byte> p : pieces) n += p.size();
  return n;
}

asio::awaitable<absl::StatusOr<std::string>> message_server::answer_serialized(
    serialized_message m, std::shared_ptr<void> room) const {
  // The parsed message holds the bytes' room in the budget until the last
  // tensor viewing its raw contents is released.
  struct held {
    // Destroyed in reverse: the message first, then its budget.
    std::shared_ptr<void> room;
    std::shared_ptr<void> extra;  // the budget taken for a message of many small fields
    inference::ModelInferRequest request;
  };
  auto message = std::make_shared<held>();
  message->room = std::move(room);
  // What parsing will build, bounded before anything is parsed: the wire
  // bytes' room, and as much again, cover what a message of tensors takes;
  // past that (many tiny fields), the rest is taken from the budget now, or
  // the request is refused.
  const std::size_t length = m.length();
  const absl::StatusOr<std::uint64_t> bound =
      parsed_bytes_bound(*inference::ModelInferRequest::descriptor(), m.pieces);
  if (!bound.ok()) co_return bound.status();
  if (const std::uint64_t extra = *bound > 2 * length ? *bound - 2 * length : 0; extra > 0) {
    if (extra > budget.limit() || !budget.try_acquire(extra)) {
      co_return absl::ResourceExhaustedError(absl::StrCat(
          "the request's ", length, " bytes would take about ", *bound,
          " once parsed (many small fields), and the memory budget has no room for the ", extra,
          " more now: send tensors as raw_input_contents"));
    }
    message->extra =
        std::shared_ptr<void>(nullptr, [b = &budget, extra](void*) { b->release(extra); });
  }
  // (parsed_bytes_bound refused a length past int's range.)
  if (!parse(m, message->request)) {
    co_return absl::InvalidArgumentError(absl::StrCat(
        "the request's ", length,
        " bytes are not a ModelInferRequest (grpc_service.proto, inference package): send one "
        "serialized message"));
  }
  std::string peer = std::move(m.peer);
  m = {};  // the bytes are let go of
  inference::ModelInferResponse response;
  // The request's fields outlive every view of them: `owner` shares `message`.
  const std::shared_ptr<void> owner(message, &message->request);
  const absl::Status s = co_await answer(message->request, owner, std::move(peer), response);
  if (!s.ok()) co_return s;
  co_return response.SerializeAsString();
}

}  // namespace dlasync::examples::kserve
