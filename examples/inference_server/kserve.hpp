// The Open Inference Protocol (KServe v2) as the inference server speaks it,
// whichever front carried the request: its datatypes, and the requests,
// responses and metadata in memory. The JSON encoding is kserve_json.hpp;
// the models that answer are kserve_models.hpp.
//
// An input's bytes are not copied out of the message that carried them: an
// input_tensor points into a buffer that its `owner` keeps alive (the
// request's body), or into the buffer its JSON `data` was converted into.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "dlasync/dlasync.hpp"

namespace dlasync::examples::kserve {

// The dtype of a protocol datatype ("FP32", "INT64", "BOOL", ...).
//   InvalidArgument  a name the protocol does not define, or BYTES, which no
//                    model here takes (its elements have no fixed size).
absl::StatusOr<dtype> dtype_of(absl::string_view datatype);

// The protocol's name for `t`; empty for a dtype it has no name for.
std::optional<absl::string_view> datatype_of(dtype t) noexcept;

// The 16-bit patterns of FP16 and BF16 elements, which have no C++
// arithmetic type here.
struct fp16_bits {
  std::uint16_t bits;
};
struct bf16_bits {
  std::uint16_t bits;
};

// The one place a datatype's element type is decided: calls
// `f(std::type_identity<T>{})` with the C++ type of `type`'s elements (bool,
// std::int8_t to std::uint64_t, float, double, fp16_bits, bf16_bits) and
// returns what it returns, or `otherwise()` for a dtype the protocol has no
// name for. Every T has the element's size.
template <typename F, typename G>
decltype(auto) visit_datatype(dtype type, F&& f, G&& otherwise) {
  if (type == dtypes::bool8) return f(std::type_identity<bool>{});
  if (type == dtypes::int8) return f(std::type_identity<std::int8_t>{});
  if (type == dtypes::int16) return f(std::type_identity<std::int16_t>{});
  if (type == dtypes::int32) return f(std::type_identity<std::int32_t>{});
  if (type == dtypes::int64) return f(std::type_identity<std::int64_t>{});
  if (type == dtypes::uint8) return f(std::type_identity<std::uint8_t>{});
  if (type == dtypes::uint16) return f(std::type_identity<std::uint16_t>{});
  if (type == dtypes::uint32) return f(std::type_identity<std::uint32_t>{});
  if (type == dtypes::uint64) return f(std::type_identity<std::uint64_t>{});
  if (type == dtypes::float32) return f(std::type_identity<float>{});
  if (type == dtypes::float64) return f(std::type_identity<double>{});
  if (type == dtypes::float16) return f(std::type_identity<fp16_bits>{});
  if (type == dtypes::bfloat16) return f(std::type_identity<bf16_bits>{});
  return otherwise();
}

// Elements in `shape`, and the bytes they take as `type`; empty when an
// extent is negative or the count or size overflows 64 bits.
std::optional<std::uint64_t> element_count(std::span<const std::int64_t> shape) noexcept;
std::optional<std::uint64_t> byte_size(dtype type, std::span<const std::int64_t> shape) noexcept;

// An input or output as model metadata states it: -1 in `shape` takes any
// extent.
struct tensor_spec {
  std::string name;
  std::string datatype;
  std::vector<std::int64_t> shape;
};

struct model_metadata {
  std::string name;
  std::vector<std::string> versions;
  std::string platform;
  std::vector<tensor_spec> inputs;
  std::vector<tensor_spec> outputs;
};

// Bytes in a registered system shared-memory region (the shared-memory
// extension): `byte_size` bytes from `offset` within the region.
struct shm_ref {
  std::string region;
  std::uint64_t offset = 0;
  std::uint64_t byte_size = 0;
};

// One input of a request: compact, row-major, host memory that `owner` keeps.
// An input that names a shared-memory region has no bytes until they are
// read from it (shm_registry.hpp); one that names a member of the request's
// remote bundle, until the bundle is fetched (kserve_service.hpp,
// bundle_fetcher).
struct input_tensor {
  std::string name;
  std::string datatype;
  dtype type;
  std::vector<std::int64_t> shape;
  std::byte* data = nullptr;
  std::uint64_t bytes = 0;
  std::shared_ptr<void> owner;
  std::optional<shm_ref> shm;
  // Its place among the members of the request's remote bundle
  // (infer_request::bundle), where it names one (dlasync_bundle_member).
  std::optional<std::uint32_t> bundle_member;
  bool read_only = false;  // bytes the server may not write (a gRPC message's)
};

// Dimensions a tensor in a request may have.
inline constexpr std::size_t max_rank = 32;
// The most members a remote bundle holds (dlasync::remote_bundle::
// max_members; remote_inputs.cpp checks that they agree).
inline constexpr std::uint32_t remote_bundle_max_members = 4096;

// Sets `in.type` and `in.bytes` from its datatype and shape. InvalidArgument
// naming the input for a datatype dtype_of refuses, more than max_rank
// dimensions, a negative extent, or a size that overflows 64 bits.
absl::Status complete_input(input_tensor& in);

// The shared-memory reference of the input or output `label` names, from
// the parameters its encoding gave (shared_memory_region,
// shared_memory_byte_size, shared_memory_offset); empty when it names no
// region. InvalidArgument for a size or offset without a region, or a
// region without a size.
absl::StatusOr<std::optional<shm_ref>> shm_ref_of(const std::string& label,
                                                  std::optional<std::string> region,
                                                  std::optional<std::uint64_t> byte_size,
                                                  std::optional<std::uint64_t> offset);

// InvalidArgument when `in` names a region whose byte size is not what its
// shape and datatype take.
absl::Status check_shm_size(const input_tensor& in);

// An output the request asks for; `binary` is its binary_data parameter,
// `shm` the region it is to be written into.
struct output_request {
  std::string name;
  std::optional<bool> binary;
  std::optional<shm_ref> shm;
};

struct infer_request {
  std::string id;
  std::string model;
  std::string version;  // empty: the model's only version
  std::vector<input_tensor> inputs;
  std::vector<output_request> outputs;  // empty: every output
  bool binary_outputs = false;          // the binary_data_output parameter
  // The encoded dlasync::remote_bundle whose members inputs name (the
  // request's dlasync_bundle parameter, base64-decoded); empty if none.
  std::string bundle;
};

// One output: compact host bytes, kept by `owner`.
struct output_tensor {
  std::string name;
  std::string datatype;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;
  std::shared_ptr<const void> owner;
  bool binary = false;
  std::optional<shm_ref> shm;  // written there, not sent
};

struct infer_response {
  std::string model;
  std::string version;
  std::string id;
  std::vector<output_tensor> outputs;
};

// `text` cut to at most `max` bytes, with "..." when cut: a name a client
// sent, quoted in an error.
std::string clip(absl::string_view text, std::size_t max = 64);

}  // namespace dlasync::examples::kserve
