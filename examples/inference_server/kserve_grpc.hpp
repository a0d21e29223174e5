// The Open Inference Protocol's gRPC messages (grpc_service.proto) to and
// from the server's requests and responses (kserve.hpp), whichever transport
// carried the message: the gRPC front, and the UCX transport that carries
// the same ModelInferRequest bytes.
//
// Everything in a message is untrusted: every size is checked against what
// shape and datatype take, with overflow checked, before a tensor is made.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "dlasync/dlasync.hpp"
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
}  // namespace dlasync::examples::kserve
