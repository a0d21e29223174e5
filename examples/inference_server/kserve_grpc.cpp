#include "kserve_grpc.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "buffer_pool.hpp"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace dlasync::examples::kserve {
namespace {

using parameters = google::protobuf::Map<std::string, inference::InferParameter>;

const char* kind_of(const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam: return "a bool_param";
    case inference::InferParameter::kInt64Param: return "an int64_param";
    case inference::InferParameter::kStringParam: return "a string_param";
    case inference::InferParameter::kDoubleParam: return "a double_param";
    case inference::InferParameter::kUint64Param: return "a uint64_param";
    default: return "empty";
  }
}

// The parameter `key` as a byte count (int64_param >= 0 or uint64_param).
absl::StatusOr<std::optional<std::uint64_t>> count_param(const parameters& params,
                                                         const std::string& key,
                                                         const std::string& label) {
  const auto it = params.find(key);
  if (it == params.end()) return std::nullopt;
  const inference::InferParameter& p = it->second;
  if (p.parameter_choice_case() == inference::InferParameter::kUint64Param) {
    return p.uint64_param();
  }
  if (p.parameter_choice_case() == inference::InferParameter::kInt64Param && p.int64_param() >= 0) {
    return static_cast<std::uint64_t>(p.int64_param());
  }
  return absl::InvalidArgumentError(
      absl::StrCat(key, " of ", label, " is ", kind_of(p), ", not a count >= 0"));
}

// The shared-memory region that `params` name, if any.
absl::StatusOr<std::optional<shm_ref>> shm_of(const parameters& params, const std::string& label) {
  const auto region = params.find("shared_memory_region");
  absl::StatusOr<std::optional<std::uint64_t>> size =
      count_param(params, "shared_memory_byte_size", label);
  if (!size.ok()) return size.status();
  absl::StatusOr<std::optional<std::uint64_t>> offset =
      count_param(params, "shared_memory_offset", label);
  if (!offset.ok()) return offset.status();
  if (region != params.end() &&
      region->second.parameter_choice_case() != inference::InferParameter::kStringParam) {
    return absl::InvalidArgumentError(absl::StrCat("shared_memory_region of ", label, " is ",
                                                   kind_of(region->second),
                                                   ", not a string_param"));
  }
  std::optional<std::string> name;
  if (region != params.end()) name = region->second.string_param();
  return shm_ref_of(label, std::move(name), *size, *offset);
}

// The request parameter that carries a remote bundle, and the input
// parameter that names one of its members.
const std::string bundle_param = "dlasync_bundle";
const std::string member_param = "dlasync_bundle_member";

// The member of the request's remote bundle that `params` name, if any.
absl::StatusOr<std::optional<std::uint32_t>> bundle_member_of(const parameters& params,
                                                              const std::string& label) {
  absl::StatusOr<std::optional<std::uint64_t>> member = count_param(params, member_param, label);
  if (!member.ok()) return member.status();
  if (!member->has_value()) return std::nullopt;
  if (**member >= remote_bundle_max_members) {
    return absl::InvalidArgumentError(absl::StrCat(member_param, " of ", label, " is ", **member,
                                                   "; a bundle holds at most ",
                                                   remote_bundle_max_members, " members"));
  }
  return static_cast<std::uint32_t>(**member);
}

// The request's remote bundle (base64 in a string_param), decoded; empty
// if none.
absl::StatusOr<std::string> bundle_of(const parameters& params) {
  const auto it = params.find(bundle_param);
  if (it == params.end()) return std::string();
  if (it->second.parameter_choice_case() != inference::InferParameter::kStringParam) {
    return absl::InvalidArgumentError(absl::StrCat(
        bundle_param, " of the request is ", kind_of(it->second), ", not a string_param (base64)"));
  }
  std::string bytes;
  if (!absl::Base64Unescape(it->second.string_param(), &bytes) || bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        bundle_param, " of the request is not an encoded dlasync::remote_bundle in base64 (",
        it->second.string_param().size(), " characters)"));
  }
  return bytes;
}

template <typename T, typename Field>
absl::Status put_all(const Field& values, std::byte* out, const std::string& label,
                     const std::string& datatype) {
  std::uint64_t index = 0;
  for (const auto v : values) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (!std::in_range<T>(v)) {
        return absl::InvalidArgumentError(absl::StrCat("element ", index, " of ", label, " is ", v,
                                                       ", not a value of ", datatype));
      }
    }
    const auto value = static_cast<T>(v);
    std::memcpy(out, &value, sizeof value);
    out += sizeof value;
    ++index;
  }
  return absl::OkStatus();
}

// The field of `c` that carries elements of type T (the protocol's
// InferTensorContents), or null for one typed contents cannot carry (FP16,
// BF16).
template <typename T>
const auto* contents_of(const inference::InferTensorContents& c) {
  if constexpr (std::is_same_v<T, bool>) {
    return &c.bool_contents();
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return &c.int64_contents();
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    return &c.uint64_contents();
  } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    return &c.int_contents();
  } else if constexpr (std::is_integral_v<T>) {
    return &c.uint_contents();
  } else if constexpr (std::is_same_v<T, float>) {
    return &c.fp32_contents();
  } else if constexpr (std::is_same_v<T, double>) {
    return &c.fp64_contents();
  } else {
    return static_cast<const google::protobuf::RepeatedField<float>*>(nullptr);
  }
}

// The number of elements `c` holds for `type`, or -1 for a datatype typed
// contents cannot carry.
std::int64_t contents_count(const inference::InferTensorContents& c, dtype type) {
  return visit_datatype(
      type,
      [&](auto t) -> std::int64_t {
        const auto* field = contents_of<typename decltype(t)::type>(c);
        return field == nullptr ? -1 : field->size();
      },
      [] { return std::int64_t{-1}; });
}

// The typed contents of `in` as its elements at `out` (contents_count said
// they can be carried, and how many there are).
absl::Status convert(const inference::InferTensorContents& c, input_tensor& in, std::byte* out) {
  const std::string label = absl::StrCat("input ", clip(in.name));
  return visit_datatype(
      in.type,
      [&](auto t) {
        using T = typename decltype(t)::type;
        if constexpr (std::is_arithmetic_v<T>) {
          return put_all<T>(*contents_of<T>(c), out, label, in.datatype);
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat(label, " is ", in.datatype, ", which typed contents cannot carry"));
        }
      },
      [&] { return absl::InvalidArgumentError(absl::StrCat(label, " has no datatype")); });
}

// The typed contents of `in`, in a buffer taken from `budget`.
absl::Status take_contents(const inference::InferTensorContents& c, input_tensor& in,
                           memory_budget& budget) {
  const std::string label = absl::StrCat("input ", clip(in.name));
  const std::int64_t seen = contents_count(c, in.type);
  if (seen < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, " is ", in.datatype,
                     ", which typed contents cannot carry exactly: send it in raw_input_contents"));
  }
  const std::uint64_t want = *element_count(in.shape);
  if (static_cast<std::uint64_t>(seen) != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("contents of ", label, " hold ", seen, " elements in the field of ",
                     in.datatype, "; its shape [", absl::StrJoin(in.shape, ","), "] has ", want));
  }
  std::shared_ptr<std::byte[]> buffer = buffer_pool::take_budgeted(budget, in.bytes);
  if (buffer == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "contents of ", label, " take ", in.bytes,
        " bytes once converted, more than the memory budget has free now: try again, or send "
        "them in raw_input_contents"));
  }
  absl::Status s = convert(c, in, buffer.get());
  if (!s.ok()) return s;
  in.data = buffer.get();
  in.owner = std::move(buffer);
  return absl::OkStatus();
}

// parsed_bytes_bound's walk, below.
using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

constexpr int max_nesting = 16;

// A message object of `d` in memory, with its place in a repeated field,
// from its fields: a header (vtable, metadata, cached size, has-bits), then
// a string, a repeated field's array header, a map or a pointer or scalar
// for each. (Not protobuf's SpaceUsedLong: on a prototype with a map field
// it reads through the map's missing storage.)
std::uint64_t message_cost(const Descriptor& d) {
  std::uint64_t bytes = 48 + 16;
  for (int i = 0; i < d.field_count(); ++i) {
    const FieldDescriptor& f = *d.field(i);
    if (f.is_map()) {
      bytes += 64;
    } else if (f.is_repeated()) {
      bytes += 24;
    } else if (f.cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      bytes += 32;
    } else {
      bytes += 8;
    }
  }
  return bytes;
}

std::uint64_t scalar_bytes(const FieldDescriptor& f) {
  switch (f.cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL: return 1;
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_ENUM: return 4;
    default: return 8;
  }
}

// `top` is the message walked, `d` the one whose field is wrong.
absl::Status malformed(const Descriptor& top, const Descriptor& d) {
  return absl::InvalidArgumentError(absl::StrCat("the bytes are not a ", top.name(),
                                                 " (grpc_service.proto): a field of ", d.name(),
                                                 " has no valid tag, or runs past its end"));
}

absl::Status walk(const Descriptor& top, const Descriptor& d, CodedInputStream& in, int depth,
                  std::uint64_t& total) {
  if (depth > max_nesting) {
    return absl::InvalidArgumentError(
        absl::StrCat("the message nests more than ", max_nesting, " messages deep"));
  }
  while (in.BytesUntilLimit() > 0) {
    const std::uint32_t tag = in.ReadTag();
    if (tag == 0) return malformed(top, d);
    const int number = WireFormatLite::GetTagFieldNumber(tag);
    const FieldDescriptor* f = d.FindFieldByNumber(number);
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("field ", number, " is not one of ", d.full_name(),
                       "'s (grpc_service.proto): this server takes no fields it does not know"));
    }
    const std::uint64_t element = f->is_repeated() ? 2 : 1;  // a growing array's slack
    switch (WireFormatLite::GetTagWireType(tag)) {
      case WireFormatLite::WIRETYPE_VARINT: {
        std::uint64_t ignored = 0;
        if (!in.ReadVarint64(&ignored)) return malformed(top, d);
        total += element * scalar_bytes(*f);
        break;
      }
      case WireFormatLite::WIRETYPE_FIXED64: {
        std::uint64_t ignored = 0;
        if (!in.ReadLittleEndian64(&ignored)) return malformed(top, d);
        total += element * 8;
        break;
      }
      case WireFormatLite::WIRETYPE_FIXED32: {
        std::uint32_t ignored = 0;
        if (!in.ReadLittleEndian32(&ignored)) return malformed(top, d);
        total += element * 4;
        break;
      }
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
        std::uint32_t length = 0;
        if (!in.ReadVarint32(&length) ||
            length > static_cast<std::uint32_t>(in.BytesUntilLimit())) {
          return malformed(top, d);
        }
        if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
          // A map's entry is a node of the map, besides the entry itself.
          total += element * message_cost(*f->message_type()) + (f->is_map() ? 128 : 0);
          const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
          if (absl::Status s = walk(top, *f->message_type(), in, depth + 1, total); !s.ok()) {
            return s;
          }
          in.PopLimit(limit);
        } else if (f->type() == FieldDescriptor::TYPE_STRING ||
                   f->type() == FieldDescriptor::TYPE_BYTES) {
          total += element * 32 + length;  // a string object, and its bytes once
          if (!in.Skip(static_cast<int>(length))) return malformed(top, d);
        } else if (f->is_packable()) {
          // Packed scalars: as many elements as the bytes hold.
          std::uint64_t count = length;  // varints: at most one a byte
          if (f->type() == FieldDescriptor::TYPE_DOUBLE ||
              f->type() == FieldDescriptor::TYPE_FIXED64 ||
              f->type() == FieldDescriptor::TYPE_SFIXED64) {
            count = length / 8;
          } else if (f->type() == FieldDescriptor::TYPE_FLOAT ||
                     f->type() == FieldDescriptor::TYPE_FIXED32 ||
                     f->type() == FieldDescriptor::TYPE_SFIXED32) {
            count = length / 4;
          }
          total += 2 * count * scalar_bytes(*f);
          if (!in.Skip(static_cast<int>(length))) return malformed(top, d);
        } else {
          return malformed(top, d);
        }
        break;
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat("field ", number, " of ", d.full_name(),
                                                       " comes as a group, which it is not"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<infer_request> from_message(const inference::ModelInferRequest& m,
                                           const std::shared_ptr<void>& owner,
                                           memory_budget& budget) {
  infer_request r;
  r.model = m.model_name();
  r.version = m.model_version();
  r.id = m.id();
  const int raw_entries = m.raw_input_contents_size();
  int raw_taken = 0;
  std::set<std::string> names;
  for (const inference::ModelInferRequest::InferInputTensor& t : m.inputs()) {
    input_tensor in;
    in.name = t.name();
    in.datatype = t.datatype();
    in.shape.assign(t.shape().begin(), t.shape().end());
    const std::string label = absl::StrCat("input ", clip(in.name));
    if (!names.insert(in.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(label, " is given twice"));
    }
    const absl::Status completed = complete_input(in);
    if (!completed.ok()) return completed;
    absl::StatusOr<std::optional<shm_ref>> region = shm_of(t.parameters(), label);
    if (!region.ok()) return region.status();
    in.shm = *std::move(region);
    absl::StatusOr<std::optional<std::uint32_t>> member = bundle_member_of(t.parameters(), label);
    if (!member.ok()) return member.status();
    in.bundle_member = *member;
    if (in.bundle_member) {
      if (in.shm || t.has_contents()) {
        return absl::InvalidArgumentError(
            absl::StrCat(label, " gives its bytes more than one way: dlasync_bundle_member and ",
                         in.shm ? "shared_memory_region" : "contents"));
      }
      if (!m.parameters().contains(bundle_param)) {
        return absl::InvalidArgumentError(
            absl::StrCat(label, " names member ", *in.bundle_member,
                         " of a remote bundle, but the request has no dlasync_bundle parameter"));
      }
    } else if (in.shm) {
      if (t.has_contents()) {
        return absl::InvalidArgumentError(absl::StrCat(
            label, " gives its bytes more than one way: contents and shared_memory_region"));
      }
      const absl::Status sized = check_shm_size(in);
      if (!sized.ok()) return sized;
    } else if (raw_entries > 0) {
      if (t.has_contents()) {
        return absl::InvalidArgumentError(
            absl::StrCat(label,
                         " has contents, but the request gives raw_input_contents: give one or the "
                         "other for all inputs"));
      }
      if (raw_taken == raw_entries) {
        return absl::InvalidArgumentError(absl::StrCat(
            "raw_input_contents holds ", raw_entries, " entries; ", label,
            " and more take none of them: one entry an input that names no shared memory"));
      }
      const std::string& bytes = m.raw_input_contents(raw_taken);
      if (bytes.size() != in.bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("raw_input_contents[", raw_taken, "] of ", label, " holds ", bytes.size(),
                         " bytes; its shape [", absl::StrJoin(in.shape, ","), "] of ", in.datatype,
                         " takes ", in.bytes));
      }
      ++raw_taken;
      // The message is gRPC's, and const: a model that writes gets a copy.
      in.data = reinterpret_cast<std::byte*>(const_cast<char*>(bytes.data()));
      in.read_only = true;
      in.owner = owner;
    } else if (t.has_contents()) {
      const absl::Status taken = take_contents(t.contents(), in, budget);
      if (!taken.ok()) return taken;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(label,
                       " has no contents, raw_input_contents entry, shared_memory_region or "
                       "dlasync_bundle_member"));
    }
    r.inputs.push_back(std::move(in));
  }
  if (raw_taken != raw_entries) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw_input_contents holds ", raw_entries, " entries; ", raw_taken,
                     " inputs take them: one entry an input that names no shared memory"));
  }
  absl::StatusOr<std::string> bundle = bundle_of(m.parameters());
  if (!bundle.ok()) return bundle.status();
  r.bundle = *std::move(bundle);
  const bool named = std::any_of(r.inputs.begin(), r.inputs.end(), [](const input_tensor& in) {
    return in.bundle_member.has_value();
  });
  if (!r.bundle.empty() && !named) {
    return absl::InvalidArgumentError(
        "the request's dlasync_bundle is named by no input's dlasync_bundle_member");
  }
  for (const inference::ModelInferRequest::InferRequestedOutputTensor& o : m.outputs()) {
    output_request out;
    out.name = o.name();
    absl::StatusOr<std::optional<shm_ref>> region =
        shm_of(o.parameters(), absl::StrCat("output ", clip(out.name)));
    if (!region.ok()) return region.status();
    out.shm = *std::move(region);
    r.outputs.push_back(std::move(out));
  }
  return r;
}

void to_message(const infer_response& r, inference::ModelInferResponse& m) {
  m.set_model_name(r.model);
  m.set_model_version(r.version);
  m.set_id(r.id);
  for (const output_tensor& o : r.outputs) {
    inference::ModelInferResponse::InferOutputTensor* t = m.add_outputs();
    t->set_name(o.name);
    t->set_datatype(o.datatype);
    for (const std::int64_t extent : o.shape) t->add_shape(extent);
    std::string* raw = m.add_raw_output_contents();
    if (o.shm) {
      (*t->mutable_parameters())["shared_memory_region"].set_string_param(o.shm->region);
      (*t->mutable_parameters())["shared_memory_byte_size"].set_int64_param(
          static_cast<std::int64_t>(o.bytes.size()));
    } else {
      raw->assign(reinterpret_cast<const char*>(o.bytes.data()), o.bytes.size());
    }
  }
}

void to_message(const model_metadata& meta, inference::ModelMetadataResponse& m) {
  m.set_name(meta.name);
  for (const std::string& v : meta.versions) m.add_versions(v);
  m.set_platform(meta.platform);
  const auto add = [](const tensor_spec& s, inference::ModelMetadataResponse::TensorMetadata* t) {
    t->set_name(s.name);
    t->set_datatype(s.datatype);
    for (const std::int64_t extent : s.shape) t->add_shape(extent);
  };
  for (const tensor_spec& s : meta.inputs) add(s, m.add_inputs());
  for (const tensor_spec& s : meta.outputs) add(s, m.add_outputs());
}

joined_pieces::joined_pieces(std::span<const std::span<const std::byte>> pieces) {
  streams_.reserve(pieces.size());
  for (const std::span<const std::byte> p : pieces) {
    streams_.push_back(&arrays_.emplace_back(p.data(), static_cast<int>(p.size())));
  }
  joined_.emplace(streams_.data(), static_cast<int>(streams_.size()));
}

absl::StatusOr<std::uint64_t> parsed_bytes_bound(
    const google::protobuf::Descriptor& type, std::span<const std::span<const std::byte>> pieces) {
  std::size_t size = 0;
  for (const std::span<const std::byte> p : pieces) {
    size += p.size();
    if (size < p.size() || size > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a message of more than ", std::numeric_limits<int>::max(), " bytes is too large"));
    }
  }
  std::uint64_t total = message_cost(type);
  if (pieces.size() <= 1) {
    CodedInputStream in(
        pieces.empty() ? nullptr : reinterpret_cast<const std::uint8_t*>(pieces[0].data()),
        static_cast<int>(size));
    if (absl::Status s = walk(type, type, in, 0, total); !s.ok()) return s;
    return total;
  }
  // Several pieces (a gRPC message's slices): read as one stream, bounded
  // by their sum.
  joined_pieces joined(pieces);
  CodedInputStream in(&joined.stream());
  in.PushLimit(static_cast<int>(size));
  if (absl::Status s = walk(type, type, in, 0, total); !s.ok()) return s;
  return total;
}

absl::StatusOr<std::uint64_t> parsed_bytes_bound(const google::protobuf::Descriptor& type,
                                                 const void* data, std::size_t size) {
  const std::span<const std::byte> one(static_cast<const std::byte*>(data), size);
  return parsed_bytes_bound(type, std::span<const std::span<const std::byte>>(&one, 1));
}

}  // namespace dlasync::examples::kserve
