#include "kserve_requests.hpp"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dlasync::examples::kserve {

inference::ModelInferRequest sum_request(absl::string_view id, std::span<const float> values) {
  inference::ModelInferRequest r;
  r.set_model_name("sum");
  r.set_id(std::string(id));
  inference::ModelInferRequest::InferInputTensor* in = r.add_inputs();
  in->set_name("INPUT0");
  in->set_datatype("FP32");
  in->add_shape(static_cast<std::int64_t>(values.size()));
  r.add_raw_input_contents()->assign(reinterpret_cast<const char*>(values.data()),
                                     values.size_bytes());
  return r;
}

absl::StatusOr<double> sum_of(const inference::ModelInferResponse& r, absl::string_view id) {
  if (r.id() != id) {
    return absl::InvalidArgumentError(
        absl::StrCat("the answer's id is \"", r.id(), "\", the request's \"", id, "\""));
  }
  if (r.outputs_size() != 1 || r.raw_output_contents_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("the answer has ", r.outputs_size(),
                                                   " outputs and ", r.raw_output_contents_size(),
                                                   " raw contents; expected one SUM"));
  }
  const auto& out = r.outputs(0);
  const std::string& raw = r.raw_output_contents(0);
  if (out.name() != "SUM" || out.datatype() != "FP64" || out.shape_size() != 1 ||
      out.shape(0) != 1 || raw.size() != sizeof(double)) {
    return absl::InvalidArgumentError(absl::StrCat("the answer's output is ", out.name(), " ",
                                                   out.datatype(), " with ", raw.size(),
                                                   " bytes; expected SUM FP64 [1], 8 bytes"));
  }
  double sum = 0;
  std::memcpy(&sum, raw.data(), sizeof sum);
  return sum;
}

absl::StatusOr<double> sum_of(absl::string_view serialized, absl::string_view id) {
  inference::ModelInferResponse r;
  if (serialized.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !r.ParseFromArray(serialized.data(), static_cast<int>(serialized.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("an answer of ", serialized.size(), " bytes that is no ModelInferResponse"));
  }
  return sum_of(r, id);
}

std::vector<std::byte> serialize(const google::protobuf::MessageLite& m) {
  std::vector<std::byte> out(m.ByteSizeLong());
  if (!out.empty()) m.SerializeWithCachedSizesToArray(reinterpret_cast<std::uint8_t*>(out.data()));
  return out;
}

}  // namespace dlasync::examples::kserve
