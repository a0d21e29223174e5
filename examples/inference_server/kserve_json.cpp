#include "kserve_json.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "buffer_pool.hpp"
#include "nlohmann/json.hpp"

namespace dlasync::examples::kserve {
namespace {

using json = nlohmann::json;

absl::Status wrong_type(absl::string_view what, const json& seen, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " is a JSON ", seen.type_name(), ", not ", expected));
}

// The member `key` of `object` when it is there; a wrong type is an error.
absl::StatusOr<const json*> member(const json& object, absl::string_view key, json::value_t type,
                                   absl::string_view what, absl::string_view expected) {
  const auto it = object.find(std::string(key));
  if (it == object.end()) return nullptr;
  const bool fits = it->type() == type || (type == json::value_t::number_unsigned &&
                                           it->is_number_integer() && it->get<std::int64_t>() >= 0);
  if (!fits) return wrong_type(what, *it, expected);
  return &*it;
}

absl::StatusOr<std::vector<std::int64_t>> parse_shape(const json& shape, absl::string_view input) {
  if (!shape.is_array()) return wrong_type(absl::StrCat("shape of ", input), shape, "an array");
  if (shape.size() > max_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape of ", input, " has ", shape.size(), " dimensions; at most ", max_rank));
  }
  std::vector<std::int64_t> out;
  for (const json& extent : shape) {
    if (!extent.is_number_integer() || extent.get<std::int64_t>() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape of ", input, " holds ", clip(extent.dump(), 32), ": extents are integers >= 0"));
    }
    out.push_back(extent.get<std::int64_t>());
  }
  return out;
}

// Counts the numbers in `data` (nested arrays, row-major), up to `depth`
// levels of arrays.
absl::StatusOr<std::uint64_t> count_elements(const json& data, std::size_t depth,
                                             absl::string_view input) {
  if (!data.is_array()) return std::uint64_t{1};
  if (depth == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data of ", input, " nests arrays deeper than its shape's rank"));
  }
  std::uint64_t n = 0;
  for (const json& item : data) {
    absl::StatusOr<std::uint64_t> inner = count_elements(item, depth - 1, input);
    if (!inner.ok()) return inner.status();
    n += *inner;
  }
  return n;
}

template <typename T>
absl::Status put_integer(const json& v, std::byte* out, absl::string_view where,
                         absl::string_view datatype) {
  bool fits = false;
  T value{};
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    fits = std::in_range<T>(u);
    value = static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    fits = std::in_range<T>(i);
    value = static_cast<T>(i);
  }
  if (!fits) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is ", clip(v.dump(), 32), ", not a value of ", datatype));
  }
  std::memcpy(out, &value, sizeof value);
  return absl::OkStatus();
}

template <typename T>
absl::Status put_float(const json& v, std::byte* out, absl::string_view where,
                       absl::string_view datatype) {
  if (!v.is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is ", clip(v.dump(), 32), ", not a number"));
  }
  const auto d = v.get<double>();
  const auto value = static_cast<T>(d);
  if (std::isfinite(d) && !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is ", clip(v.dump(), 32), ", past the range of ", datatype));
  }
  std::memcpy(out, &value, sizeof value);
  return absl::OkStatus();
}

// Writes each number of `data` as `type` at `out`, advancing it.
absl::Status convert(const json& data, dtype type, absl::string_view datatype, std::byte*& out,
                     std::uint64_t& index, absl::string_view input) {
  if (data.is_array()) {
    for (const json& item : data) {
      absl::Status s = convert(item, type, datatype, out, index, input);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  const std::string where = absl::StrCat("element ", index, " of ", input);
  absl::Status s = visit_datatype(
      type,
      [&](auto t) -> absl::Status {
        using T = typename decltype(t)::type;
        if constexpr (std::is_same_v<T, bool>) {
          if (!data.is_boolean()) {
            return absl::InvalidArgumentError(
                absl::StrCat(where, " is ", clip(data.dump(), 32), ", not a BOOL"));
          }
          *out = std::byte{data.get<bool>() ? std::uint8_t{1} : std::uint8_t{0}};
          return absl::OkStatus();
        } else if constexpr (std::is_integral_v<T>) {
          return put_integer<T>(data, out, where, datatype);
        } else if constexpr (std::is_floating_point_v<T>) {
          return put_float<T>(data, out, where, datatype);
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat(input, " is ", datatype,
                           ", which JSON data cannot carry exactly: send it as binary data "
                           "(parameters.binary_data_size, with Inference-Header-Content-Length)"));
        }
      },
      [&] { return absl::InvalidArgumentError(absl::StrCat(input, " has no datatype")); });
  if (!s.ok()) return s;
  out += type.padded_size();
  ++index;
  return absl::OkStatus();
}

// The bytes of `input`'s JSON `data`, in a buffer taken from `budget`.
absl::Status take_json_data(const json& data, input_tensor& input, memory_budget& budget) {
  const std::string label = absl::StrCat("input ", clip(input.name));
  absl::StatusOr<std::uint64_t> seen = count_elements(data, input.shape.size(), label);
  if (!seen.ok()) return seen.status();
  const std::uint64_t want = *element_count(input.shape);
  if (*seen != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("data of ", label, " holds ", *seen, " elements; its shape [",
                     absl::StrJoin(input.shape, ","), "] has ", want));
  }
  std::shared_ptr<std::byte[]> buffer = buffer_pool::take_budgeted(budget, input.bytes);
  if (buffer == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "data of ", label, " takes ", input.bytes,
        " bytes once converted, more than the memory budget has free now: try again, or send "
        "it as binary data"));
  }
  std::byte* out = buffer.get();
  std::uint64_t index = 0;
  absl::Status s = convert(data, input.type, input.datatype, out, index, label);
  if (!s.ok()) return s;
  input.data = buffer.get();
  input.owner = std::move(buffer);
  return absl::OkStatus();
}

// The shared-memory region that `params` name, if any.
absl::StatusOr<std::optional<shm_ref>> parse_shm(const json& params, const std::string& label) {
  absl::StatusOr<const json*> region =
      member(params, "shared_memory_region", json::value_t::string,
             absl::StrCat("shared_memory_region of ", label), "a string");
  if (!region.ok()) return region.status();
  absl::StatusOr<const json*> size =
      member(params, "shared_memory_byte_size", json::value_t::number_unsigned,
             absl::StrCat("shared_memory_byte_size of ", label), "an integer >= 0");
  if (!size.ok()) return size.status();
  absl::StatusOr<const json*> offset =
      member(params, "shared_memory_offset", json::value_t::number_unsigned,
             absl::StrCat("shared_memory_offset of ", label), "an integer >= 0");
  if (!offset.ok()) return offset.status();
  const auto count = [](const json* j) {
    return j != nullptr ? std::optional(j->get<std::uint64_t>()) : std::nullopt;
  };
  std::optional<std::string> name;
  if (*region != nullptr) name = (*region)->get<std::string>();
  return shm_ref_of(label, std::move(name), count(*size), count(*offset));
}

absl::StatusOr<input_tensor> parse_input(const json& j, std::size_t index) {
  if (!j.is_object()) return wrong_type(absl::StrCat("inputs[", index, "]"), j, "an object");
  input_tensor in;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("inputs[", index, "] needs a \"name\" that is a string"));
  }
  in.name = name->get<std::string>();
  const std::string label = absl::StrCat("input ", clip(in.name));
  const auto datatype = j.find("datatype");
  if (datatype == j.end() || !datatype->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, " needs a \"datatype\" that is a string"));
  }
  in.datatype = datatype->get<std::string>();
  const auto shape = j.find("shape");
  if (shape == j.end())
    return absl::InvalidArgumentError(absl::StrCat(label, " needs a \"shape\""));
  absl::StatusOr<std::vector<std::int64_t>> dims = parse_shape(*shape, label);
  if (!dims.ok()) return dims.status();
  in.shape = *std::move(dims);
  const absl::Status completed = complete_input(in);
  if (!completed.ok()) return completed;
  return in;
}

}  // namespace

absl::StatusOr<infer_request> parse_infer_request(const request_body& body, absl::string_view model,
                                                  absl::string_view version,
                                                  memory_budget& budget) {
  const std::uint64_t json_length = body.header_length.value_or(body.length);
  if (json_length > body.length) {
    return absl::InvalidArgumentError(absl::StrCat("Inference-Header-Content-Length is ",
                                                   json_length, ", past the body's ", body.length,
                                                   " bytes"));
  }
  const auto* text = reinterpret_cast<const char*>(body.bytes.get());
  json j;
  try {
    j = json::parse(text, text + json_length);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the request is not JSON: ", e.what()));
  }
  if (!j.is_object()) return wrong_type("the request", j, "an object");
  infer_request r;
  r.model = std::string(model);
  r.version = std::string(version);
  absl::StatusOr<const json*> id = member(j, "id", json::value_t::string, "\"id\"", "a string");
  if (!id.ok()) return id.status();
  if (*id != nullptr) r.id = (*id)->get<std::string>();
  absl::StatusOr<const json*> params =
      member(j, "parameters", json::value_t::object, "\"parameters\"", "an object");
  if (!params.ok()) return params.status();
  if (*params != nullptr) {
    absl::StatusOr<const json*> binary =
        member(**params, "binary_data_output", json::value_t::boolean,
               "parameters.binary_data_output", "a boolean");
    if (!binary.ok()) return binary.status();
    if (*binary != nullptr) r.binary_outputs = (*binary)->get<bool>();
  }
  const auto inputs = j.find("inputs");
  if (inputs == j.end()) return absl::InvalidArgumentError("the request needs \"inputs\"");
  if (!inputs->is_array()) return wrong_type("\"inputs\"", *inputs, "an array");
  std::uint64_t offset = json_length;  // the next input's binary data
  std::set<std::string> names;
  for (std::size_t i = 0; i < inputs->size(); ++i) {
    const json& item = (*inputs)[i];
    absl::StatusOr<input_tensor> in = parse_input(item, i);
    if (!in.ok()) return in.status();
    const std::string label = absl::StrCat("input ", clip(in->name));
    if (!names.insert(in->name).second) {
      return absl::InvalidArgumentError(absl::StrCat(label, " is given twice"));
    }
    const json* binary_size = nullptr;
    absl::StatusOr<const json*> p = member(item, "parameters", json::value_t::object,
                                           absl::StrCat("parameters of ", label), "an object");
    if (!p.ok()) return p.status();
    if (*p != nullptr) {
      absl::StatusOr<std::optional<shm_ref>> region = parse_shm(**p, label);
      if (!region.ok()) return region.status();
      in->shm = *std::move(region);
      absl::StatusOr<const json*> size =
          member(**p, "binary_data_size", json::value_t::number_unsigned,
                 absl::StrCat("binary_data_size of ", label), "an integer >= 0");
      if (!size.ok()) return size.status();
      binary_size = *size;
    }
    const auto data = item.find("data");
    const int sources = static_cast<int>(binary_size != nullptr) +
                        static_cast<int>(data != item.end()) +
                        static_cast<int>(in->shm.has_value());
    if (sources > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(label,
                       " gives its bytes more than one way: give one of \"data\", binary_data_size "
                       "and shared_memory_region"));
    }
    if (in->shm) {
      const absl::Status sized = check_shm_size(*in);
      if (!sized.ok()) return sized;
    } else if (binary_size != nullptr) {
      if (!body.header_length) {
        return absl::InvalidArgumentError(absl::StrCat(
            label,
            " has binary_data_size, but the request has no Inference-Header-Content-Length "
            "header to say where its JSON ends"));
      }
      const auto size = binary_size->get<std::uint64_t>();
      if (size != in->bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "binary_data_size of ", label, " is ", size, " bytes, but its shape [",
            absl::StrJoin(in->shape, ","), "] of ", in->datatype, " takes ", in->bytes));
      }
      if (size > body.length - offset) {
        return absl::InvalidArgumentError(
            absl::StrCat("binary data of ", label, " (", size, " bytes from byte ", offset,
                         ") runs past the body's ", body.length, " bytes"));
      }
      in->data = body.bytes.get() + offset;
      in->owner = body.bytes;
      offset += size;
    } else if (data == item.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, " has no \"data\", binary_data_size or shared_memory_region"));
    } else {
      absl::Status s = take_json_data(*data, *in, budget);
      if (!s.ok()) return s;
    }
    r.inputs.push_back(*std::move(in));
  }
  if (offset != body.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("the body has ", body.length - offset,
                     " bytes after the JSON and the inputs' binary data, which no input claims"));
  }
  const auto outputs = j.find("outputs");
  if (outputs != j.end()) {
    if (!outputs->is_array()) return wrong_type("\"outputs\"", *outputs, "an array");
    for (std::size_t i = 0; i < outputs->size(); ++i) {
      const json& o = (*outputs)[i];
      if (!o.is_object() || !o.contains("name") || !o["name"].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("outputs[", i, "] needs to be an object with a \"name\" string"));
      }
      output_request out{o["name"].get<std::string>(), std::nullopt, std::nullopt};
      absl::StatusOr<const json*> p =
          member(o, "parameters", json::value_t::object,
                 absl::StrCat("parameters of output ", clip(out.name)), "an object");
      if (!p.ok()) return p.status();
      if (*p != nullptr) {
        absl::StatusOr<const json*> b =
            member(**p, "binary_data", json::value_t::boolean,
                   absl::StrCat("binary_data of output ", clip(out.name)), "a boolean");
        if (!b.ok()) return b.status();
        if (*b != nullptr) out.binary = (*b)->get<bool>();
        absl::StatusOr<std::optional<shm_ref>> region =
            parse_shm(**p, absl::StrCat("output ", clip(out.name)));
        if (!region.ok()) return region.status();
        out.shm = *std::move(region);
        if (out.shm && out.binary.value_or(false)) {
          return absl::InvalidArgumentError(
              absl::StrCat("output ", clip(out.name),
                           " asks for binary_data and a shared-memory region: give one"));
        }
      }
      r.outputs.push_back(std::move(out));
    }
  }
  return r;
}

namespace {

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1FU;
  const std::uint32_t mantissa = h & 0x3FFU;
  if (exponent == 0) {
    const float f = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -f : f;
  }
  const std::uint32_t bits = exponent == 0x1F
                                 ? (sign | 0x7F800000U | (mantissa << 13))
                                 : (sign | ((exponent + 112) << 23) | (mantissa << 13));
  return std::bit_cast<float>(bits);
}

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

json element(dtype t, const std::byte* p) {
  return visit_datatype(
      t,
      [&](auto type) -> json {
        using T = typename decltype(type)::type;
        if constexpr (std::is_same_v<T, bool>) {
          return load<std::uint8_t>(p) != 0;
        } else if constexpr (std::is_same_v<T, fp16_bits>) {
          return half_to_float(load<std::uint16_t>(p));
        } else if constexpr (std::is_same_v<T, bf16_bits>) {
          return std::bit_cast<float>(static_cast<std::uint32_t>(load<std::uint16_t>(p)) << 16);
        } else {
          return load<T>(p);
        }
      },
      [] { return json(nullptr); });
}

// Invalid UTF-8 (a name from a URL) is replaced, not thrown over.
std::string dump_text(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json spec_json(const tensor_spec& s) {
  return json{{"name", s.name}, {"datatype", s.datatype}, {"shape", s.shape}};
}

}  // namespace

encoded_response encode_infer_response(const infer_response& r) {
  encoded_response out;
  json j{{"model_name", r.model}};
  if (!r.version.empty()) j["model_version"] = r.version;
  if (!r.id.empty()) j["id"] = r.id;
  json outputs = json::array();
  for (const output_tensor& o : r.outputs) {
    json t{{"name", o.name}, {"datatype", o.datatype}, {"shape", o.shape}};
    if (o.shm) {
      t["parameters"] = json{{"shared_memory_region", o.shm->region},
                             {"shared_memory_byte_size", o.bytes.size()}};
    } else if (o.binary) {
      t["parameters"] = json{{"binary_data_size", o.bytes.size()}};
      out.binary.push_back(o.bytes);
    } else {
      const dtype type = *dtype_of(o.datatype);
      json data = json::array();
      const std::size_t step = type.padded_size();
      for (std::size_t at = 0; at + step <= o.bytes.size(); at += step) {
        data.push_back(element(type, o.bytes.data() + at));
      }
      t["data"] = std::move(data);
    }
    outputs.push_back(std::move(t));
  }
  j["outputs"] = std::move(outputs);
  out.json = dump_text(j);
  return out;
}

std::string encode_model_metadata(const model_metadata& m) {
  json inputs = json::array();
  for (const tensor_spec& s : m.inputs) inputs.push_back(spec_json(s));
  json outputs = json::array();
  for (const tensor_spec& s : m.outputs) outputs.push_back(spec_json(s));
  return dump_text(json{{"name", m.name},
                        {"versions", m.versions},
                        {"platform", m.platform},
                        {"inputs", inputs},
                        {"outputs", outputs}});
}

std::string encode_server_metadata(absl::string_view name, absl::string_view version,
                                   std::span<const absl::string_view> extensions) {
  json ext = json::array();
  for (const absl::string_view e : extensions) ext.push_back(e);
  return dump_text(json{{"name", name}, {"version", version}, {"extensions", ext}});
}

absl::StatusOr<shm_region_info> parse_shm_register(absl::string_view body, absl::string_view name) {
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the request is not JSON: ", e.what()));
  }
  if (!j.is_object()) return wrong_type("the request", j, "an object");
  shm_region_info info;
  info.name = std::string(name);
  absl::StatusOr<const json*> key = member(j, "key", json::value_t::string, "\"key\"", "a string");
  if (!key.ok()) return key.status();
  absl::StatusOr<const json*> offset =
      member(j, "offset", json::value_t::number_unsigned, "\"offset\"", "an integer >= 0");
  if (!offset.ok()) return offset.status();
  absl::StatusOr<const json*> size =
      member(j, "byte_size", json::value_t::number_unsigned, "\"byte_size\"", "an integer >= 0");
  if (!size.ok()) return size.status();
  if (*key == nullptr || *size == nullptr) {
    return absl::InvalidArgumentError(
        "a shared-memory registration needs \"key\" and \"byte_size\" (and may give "
        "\"offset\")");
  }
  info.key = (*key)->get<std::string>();
  info.byte_size = (*size)->get<std::uint64_t>();
  if (*offset != nullptr) info.offset = (*offset)->get<std::uint64_t>();
  return info;
}

std::string encode_shm_status(std::span<const shm_region_info> regions) {
  json out = json::array();
  for (const shm_region_info& r : regions) {
    out.push_back(
        json{{"name", r.name}, {"key", r.key}, {"offset", r.offset}, {"byte_size", r.byte_size}});
  }
  return dump_text(out);
}

std::string encode_error(absl::string_view message) {
  return dump_text(json{{"error", message}});
}

}  // namespace dlasync::examples::kserve
