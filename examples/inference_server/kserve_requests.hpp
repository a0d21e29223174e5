// Requests a client of the inference server makes, as gRPC messages
// (grpc_service.proto), and the checks of their answers: for the load
// client, its misbehaving UCX peers and the UCX transport's fuzzer.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpc_service.pb.h"

namespace dlasync::examples::kserve {

// A request for the `sum` model: INPUT0, FP32, shape [values.size()], with
// `values` as its raw contents.
inference::ModelInferRequest sum_request(absl::string_view id, std::span<const float> values);

// The SUM output of a `sum` answer; InvalidArgument naming what is wrong
// with the answer (not one FP64 [1] output named SUM with 8 raw bytes, or
// another id than `id`).
absl::StatusOr<double> sum_of(const inference::ModelInferResponse& r, absl::string_view id);
// The same, from the serialized answer.
absl::StatusOr<double> sum_of(absl::string_view serialized, absl::string_view id);

// `m`, serialized.
std::vector<std::byte> serialize(const google::protobuf::MessageLite& m);

}  // namespace dlasync::examples::kserve
