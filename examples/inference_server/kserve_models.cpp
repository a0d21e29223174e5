#include "kserve_models.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlasync::examples::kserve {
namespace {

std::string shape_text(std::span<const std::int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string names_of(std::span<const tensor_spec> specs) {
  return absl::StrJoin(specs, ", ",
                       [](std::string* out, const tensor_spec& s) { out->append(s.name); });
}

const tensor_spec* spec_named(std::span<const tensor_spec> specs, absl::string_view name) {
  for (const tensor_spec& s : specs) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

bool shape_fits(std::span<const std::int64_t> spec, std::span<const std::int64_t> seen) {
  if (spec.size() != seen.size()) return false;
  for (std::size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] != -1 && spec[i] != seen[i]) return false;
  }
  return true;
}

const input_tensor& input_named(const infer_request& r, absl::string_view name) {
  return *std::find_if(r.inputs.begin(), r.inputs.end(),
                       [&](const input_tensor& in) { return in.name == name; });
}

absl::Status with_input(const absl::Status& s, absl::string_view input) {
  return {s.code(), absl::StrCat("input ", input, ": ", s.message())};
}

}  // namespace

model_handler::model_handler(runtime& rt, device_sum& compute, device target)
    : rt_(rt), compute_(compute), target_(target) {
  models_.push_back({"sum", {"1"}, "dlasync", {{"INPUT0", "FP32", {-1}}}, {{"SUM", "FP64", {1}}}});
  models_.push_back({"echo",
                     {"1"},
                     "dlasync",
                     {{"INPUT0", "FP32", {-1, -1}}, {"INPUT1", "INT64", {-1}}},
                     {{"OUTPUT0", "FP32", {-1, -1}}, {"OUTPUT1", "INT64", {-1}}}});
  models_.push_back(
      {"negate", {"1"}, "dlasync", {{"INPUT0", "FP32", {-1}}}, {{"OUTPUT0", "FP32", {-1}}}});
}

absl::StatusOr<const model_metadata*> model_handler::find(absl::string_view model,
                                                          absl::string_view version) const {
  for (const model_metadata& m : models_) {
    if (m.name != model) continue;
    if (!version.empty() &&
        std::find(m.versions.begin(), m.versions.end(), version) == m.versions.end()) {
      return absl::NotFoundError(
          absl::StrCat("model ", m.name, " has no version \"", clip(version),
                       "\"; its versions: ", absl::StrJoin(m.versions, ", ")));
    }
    return &m;
  }
  return absl::NotFoundError(absl::StrCat(
      "model \"", clip(model), "\" is not served here; the models are ",
      absl::StrJoin(models_, ", ",
                    [](std::string* out, const model_metadata& m) { out->append(m.name); })));
}

absl::Status model_handler::check(const model_metadata& m, const infer_request& r) const {
  for (const input_tensor& in : r.inputs) {
    const tensor_spec* spec = spec_named(m.inputs, in.name);
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("model ", m.name, " has no input \"",
                                                     clip(in.name),
                                                     "\"; its inputs: ", names_of(m.inputs)));
    }
    if (spec->datatype != in.datatype) {
      return absl::InvalidArgumentError(absl::StrCat("input ", spec->name, " of model ", m.name,
                                                     " is ", spec->datatype, "; the request sends ",
                                                     in.datatype));
    }
    if (!shape_fits(spec->shape, in.shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input ", spec->name, " of model ", m.name, " has shape ", shape_text(spec->shape),
          " (-1: any extent); the request's is ", shape_text(in.shape)));
    }
  }
  for (const tensor_spec& spec : m.inputs) {
    const bool given = std::any_of(r.inputs.begin(), r.inputs.end(),
                                   [&](const input_tensor& in) { return in.name == spec.name; });
    if (!given) {
      return absl::InvalidArgumentError(
          absl::StrCat("the request lacks input ", spec.name, " of model ", m.name));
    }
  }
  for (std::size_t i = 0; i < r.outputs.size(); ++i) {
    const std::string& name = r.outputs[i].name;
    if (spec_named(m.outputs, name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("model ", m.name, " has no output \"",
                                                     clip(name),
                                                     "\"; its outputs: ", names_of(m.outputs)));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (r.outputs[j].name == name) {
        return absl::InvalidArgumentError(absl::StrCat("output ", name, " is asked for twice"));
      }
    }
  }
  return absl::OkStatus();
}

asio::awaitable<absl::StatusOr<tensor>> model_handler::import_input(const input_tensor& in,
                                                                    import_options options) {
  tensor_description d;
  d.data = in.data;
  d.dtype = in.type;
  d.shape = in.shape;
  if (in.read_only) d.flags = flag_read_only;  // a model that writes gets a copy
  // The input's buffer lives while the tensor views it.
  managed_tensor source = make_managed_tensor(std::move(d), [owner = in.owner] {});
  // Elements are read where they lie only when aligned to their size: binary
  // data follows JSON of any length.
  options.min_alignment = std::max<std::size_t>(options.min_alignment, in.type.padded_size());
  absl::StatusOr<tensor> t = co_await import_dlpack(rt_, source, options);
  if (!t.ok()) co_return with_input(t.status(), in.name);
  co_return t;
}

asio::awaitable<absl::StatusOr<output_tensor>> model_handler::to_output(
    tensor t, std::optional<std::int64_t> stream) {
  output_tensor out;
  out.datatype = std::string(*datatype_of(t.dtype()));
  out.shape.assign(t.shape().begin(), t.shape().end());
  if (!is_host_memory(t.device().kind)) {
    absl::StatusOr<DLManagedTensorVersioned*> exported = t.to_dlpack_versioned();
    if (!exported.ok()) co_return exported.status();
    managed_tensor source(*exported);
    import_options back;
    back.target = host_device;
    back.stream = stream;
    back.require_contiguous = true;
    absl::StatusOr<tensor> host = co_await import_dlpack(rt_, source, back);
    if (!host.ok()) co_return host.status();
    t = *std::move(host);
  }
  auto kept = std::make_shared<const tensor>(std::move(t));
  out.bytes = {static_cast<const std::byte*>(kept->data()), kept->byte_size()};
  out.owner = std::move(kept);
  co_return out;
}

asio::awaitable<absl::StatusOr<std::vector<output_tensor>>> model_handler::run(
    const model_metadata& m, infer_request& r) {
  std::vector<output_tensor> outputs;
  if (m.name == "sum") {
    import_options o;
    o.target = target_;
    o.require_contiguous = true;
    o.consumer_stream = compute_.stream_for(target_);
    absl::StatusOr<tensor> t = co_await import_input(input_named(r, "INPUT0"), o);
    if (!t.ok()) co_return t.status();
    absl::StatusOr<double> sum = co_await compute_.sum(*t, o.consumer_stream);
    if (!sum.ok()) co_return sum.status();
    auto value = std::make_shared<double>(*sum);
    output_tensor out{"SUM", "FP64", {1}, {}, nullptr, false, std::nullopt};
    out.bytes = {reinterpret_cast<const std::byte*>(value.get()), sizeof(double)};
    out.owner = std::move(value);
    outputs.push_back(std::move(out));
  } else if (m.name == "echo") {
    for (const tensor_spec& spec : m.outputs) {
      const std::string input = absl::StrCat("INPUT", spec.name.substr(6));
      import_options o;
      o.target = target_;
      o.require_contiguous = true;
      o.consumer_stream = compute_.stream_for(target_);
      absl::StatusOr<tensor> t = co_await import_input(input_named(r, input), o);
      if (!t.ok()) co_return t.status();
      absl::StatusOr<output_tensor> out = co_await to_output(*std::move(t), o.consumer_stream);
      if (!out.ok()) co_return with_input(out.status(), input);
      out->name = spec.name;
      outputs.push_back(*std::move(out));
    }
  } else {  // negate, on the host
    import_options o;
    o.target = host_device;
    o.require_contiguous = true;
    o.require_writable = true;
    absl::StatusOr<tensor> t = co_await import_input(input_named(r, "INPUT0"), o);
    if (!t.ok()) co_return t.status();
    auto* x = static_cast<float*>(t->data());
    for (std::int64_t i = 0; i < t->element_count(); ++i) x[i] = -x[i];
    absl::StatusOr<output_tensor> out = co_await to_output(*std::move(t), std::nullopt);
    if (!out.ok()) co_return out.status();
    out->name = "OUTPUT0";
    outputs.push_back(*std::move(out));
  }
  co_return outputs;
}

asio::awaitable<absl::StatusOr<infer_response>> model_handler::infer(infer_request r) {
  absl::StatusOr<const model_metadata*> m = find(r.model, r.version);
  if (!m.ok()) co_return m.status();
  const absl::Status checked = check(**m, r);
  if (!checked.ok()) co_return checked;
  absl::StatusOr<std::vector<output_tensor>> outputs = co_await run(**m, r);
  if (!outputs.ok()) co_return outputs.status();
  infer_response response;
  response.model = (*m)->name;
  response.version = (*m)->versions.front();
  response.id = r.id;
  for (output_tensor& out : *outputs) {
    const auto asked = std::find_if(r.outputs.begin(), r.outputs.end(),
                                    [&](const output_request& o) { return o.name == out.name; });
    if (!r.outputs.empty() && asked == r.outputs.end()) continue;
    out.binary = r.binary_outputs;
    if (asked != r.outputs.end() && asked->binary) out.binary = *asked->binary;
    if (asked != r.outputs.end()) out.shm = asked->shm;
    response.outputs.push_back(std::move(out));
  }
  co_return response;
}

}  // namespace dlasync::examples::kserve
