// The Open Inference Protocol's gRPC messages (grpc_service.proto) to and
// from the server's requests and responses (kserve.hpp), whichever transport
// carried the message: the gRPC front, and the UCX transport that carries
// the same ModelInferRequest bytes.
//
// Everything in a message is untrusted: every size is checked against what
// shape and datatype take, with overflow checked, before a tensor is made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "dlasync/dlasync.hpp"
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpc_service.pb.h"
#include "kserve.hpp"
#include "shm_registry.hpp"

namespace dlasync::examples::kserve {

// The request in `m`. Inputs in raw_input_contents point into `m`, which
// `owner` keeps alive, and are read-only; typed `contents` are converted
// into buffers whose bytes are taken from `budget`.
//   InvalidArgument  a datatype, shape or parameter of the wrong form, raw
//                    contents whose count or sizes disagree with the inputs,
//                    both raw and typed contents, typed contents of the
//                    wrong field or count;
//   ResourceExhausted  converted contents find no room in the budget.
absl::StatusOr<infer_request> from_message(const inference::ModelInferRequest& m,
                                           const std::shared_ptr<void>& owner,
                                           memory_budget& budget);

// `r` into `m`: every output not written to shared memory as raw bytes.
void to_message(const infer_response& r, inference::ModelInferResponse& m);

void to_message(const model_metadata& meta, inference::ModelMetadataResponse& m);

// How many bytes parsing the `size` bytes at `data` as a message of `type`
// may take on the heap, at most: each message object (its prototype's
// size), each string's bytes, each repeated element (twice, for a growing
// array), each map entry. A message's wire size says little of it: an empty
// submessage is 2 bytes on the wire and a hundred parsed, a small packed
// int64 one byte and eight. Walks the wire format (protobuf's
// CodedInputStream) against `type`'s descriptor before anything is parsed.
//   InvalidArgument  bytes that are not such a message, a field `type` does
//                    not have (its unknown-field set would grow without
//                    bound too), or messages nested deeper than 16.
absl::StatusOr<std::uint64_t> parsed_bytes_bound(const google::protobuf::Descriptor& type,
                                                 const void* data, std::size_t size);
// Pieces of a message (a gRPC message's slices), read in order as one
// stream. Each piece is at most int's range of bytes.
class joined_pieces {
 public:
  explicit joined_pieces(std::span<const std::span<const std::byte>> pieces);
  joined_pieces(const joined_pieces&) = delete;
  joined_pieces& operator=(const joined_pieces&) = delete;

  google::protobuf::io::ZeroCopyInputStream& stream() { return *joined_; }

 private:
  std::deque<google::protobuf::io::ArrayInputStream> arrays_;  // neither copied nor moved
  std::vector<google::protobuf::io::ZeroCopyInputStream*> streams_;
  std::optional<google::protobuf::io::ConcatenatingInputStream> joined_;
};

// The same for a message in several pieces, read in order as one (a gRPC
// message's slices).
absl::StatusOr<std::uint64_t> parsed_bytes_bound(
    const google::protobuf::Descriptor& type, std::span<const std::span<const std::byte>> pieces);
}  // namespace dlasync::examples::kserve
