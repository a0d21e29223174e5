// The Open Inference Protocol's JSON encoding (REST), with its binary tensor
// data extension: the JSON of a request or response may be followed by the
// tensors' raw bytes, in the order of the tensors that name a
// `binary_data_size`, the JSON's own length given by the
// Inference-Header-Content-Length header.
//
//   request_body body{bytes, length, header_length};
//   absl::StatusOr<infer_request> r = parse_infer_request(body, "sum", "", budget);
//   encoded_response out = encode_infer_response(answer);
//
// Everything in a body is untrusted: every field's type is checked, every
// size against the body's bounds with overflow checked, and nothing is read
// past `length`. Errors are InvalidArgument naming the field, the value
// seen and what is expected, or ResourceExhausted when JSON data would not
// fit the memory budget once converted.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "dlasync/dlasync.hpp"
#include "kserve.hpp"
#include "shm_registry.hpp"

namespace dlasync::examples::kserve {

// A request's body as it arrived.
struct request_body {
  std::shared_ptr<std::byte[]> bytes;
  std::uint64_t length = 0;
  // Inference-Header-Content-Length, when the request carries binary data.
  std::optional<std::uint64_t> header_length;
};

// The inference request in `body` for `model` (and `version`, from the
// URL). Inputs given as binary data point into `body`; inputs given as JSON
// `data` are converted into buffers whose bytes are taken from `budget` and
// given back when the last user drops them.
absl::StatusOr<infer_request> parse_infer_request(const request_body& body, absl::string_view model,
                                                  absl::string_view version, memory_budget& budget);

// A response: its JSON, then the binary outputs' bytes in order (none when
// no output is binary; then no Inference-Header-Content-Length is sent).
struct encoded_response {
  std::string json;
  std::vector<std::span<const std::byte>> binary;
};

encoded_response encode_infer_response(const infer_response& r);
std::string encode_model_metadata(const model_metadata& m);
std::string encode_server_metadata(absl::string_view name, absl::string_view version,
                                   std::span<const absl::string_view> extensions);
// The body of a shared-memory register request: {"key", "offset",
// "byte_size"}, for the region `name` (from the URL).
absl::StatusOr<shm_region_info> parse_shm_register(absl::string_view body, absl::string_view name);
// The shared-memory status: [{"name", "key", "offset", "byte_size"}, ...].
std::string encode_shm_status(std::span<const shm_region_info> regions);

// {"error": message}, the protocol's error body.
std::string encode_error(absl::string_view message);

}  // namespace dlasync::examples::kserve
