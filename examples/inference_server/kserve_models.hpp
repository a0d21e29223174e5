// The models the inference server serves, and the handler that checks an
// inference request against a model's metadata, imports its inputs with
// dlasync and runs the model. Every front (REST, and the others to come)
// hands its parsed requests here.
//
//   sum     INPUT0 FP32 [-1]           -> SUM FP64 [1]
//           imported onto the server's device (--device), summed there.
//   echo    INPUT0 FP32 [-1,-1],       -> OUTPUT0, OUTPUT1: the inputs as sent
//           INPUT1 INT64 [-1]
//           imported onto the server's device and back to the host, so a
//           GPU server moves each input both ways.
//   negate  INPUT0 FP32 [-1]           -> OUTPUT0 FP32 [-1]: -INPUT0
//           needs contiguous, writable, aligned host memory: dlasync imports
//           an input that is not so (read-only, or misaligned in the body)
//           as a copy, and one that is as a view, negated in place.
//
// Every model has the one version "1". An input's datatype and rank must
// match the metadata, and each fixed extent (not -1).
//
// Thread safety: infer() may run from any number of coroutines at once.
#pragma once

#include <span>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "asio/awaitable.hpp"
#include "common/device_sum.hpp"
#include "dlasync/dlasync.hpp"
#include "kserve.hpp"

namespace dlasync::examples::kserve {

class model_handler {
 public:
  // `rt` and `compute` outlive the handler and every infer() under way.
  model_handler(runtime& rt, device_sum& compute, device target);

  std::span<const model_metadata> models() const { return models_; }

  // The metadata of `model` at `version` (empty: its only version).
  //   NotFound  a model not served here, or a version it does not have.
  absl::StatusOr<const model_metadata*> find(absl::string_view model,
                                             absl::string_view version) const;

  // The response to `r`, or the error that names what is wrong:
  //   NotFound         the model or version (find);
  //   InvalidArgument  inputs or outputs that the metadata does not state,
  //                    a datatype or shape that disagrees with it, an input
  //                    missing or given twice;
  //   what dlasync's import says (ResourceExhausted over its copy budget,
  //   ...), with the input named.
  asio::awaitable<absl::StatusOr<infer_response>> infer(infer_request r);

 private:
  absl::Status check(const model_metadata& m, const infer_request& r) const;
  // `in` imported with `options` (its target set).
  asio::awaitable<absl::StatusOr<tensor>> import_input(const input_tensor& in,
                                                       import_options options);
  // The compact host bytes of `t`, imported back from a GPU when it is on
  // one, after the work on `stream`.
  asio::awaitable<absl::StatusOr<output_tensor>> to_output(tensor t,
                                                           std::optional<std::int64_t> stream);
  asio::awaitable<absl::StatusOr<std::vector<output_tensor>>> run(const model_metadata& m,
                                                                  infer_request& r);

  runtime& rt_;
  device_sum& compute_;
  const device target_;
  std::vector<model_metadata> models_;
};

}  // namespace dlasync::examples::kserve
