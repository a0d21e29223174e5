#include "kserve.hpp"

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlasync::examples::kserve {
namespace {

// The protocol's datatypes with a fixed element size, as DLPack dtypes.
constexpr std::array<std::pair<absl::string_view, dtype>, 13> datatypes{{
    {"BOOL", dtypes::bool8},
    {"UINT8", dtypes::uint8},
    {"UINT16", dtypes::uint16},
    {"UINT32", dtypes::uint32},
    {"UINT64", dtypes::uint64},
    {"INT8", dtypes::int8},
    {"INT16", dtypes::int16},
    {"INT32", dtypes::int32},
    {"INT64", dtypes::int64},
    {"FP16", dtypes::float16},
    {"FP32", dtypes::float32},
    {"FP64", dtypes::float64},
    {"BF16", dtypes::bfloat16},
}};

}  // namespace

absl::StatusOr<dtype> dtype_of(absl::string_view datatype) {
  for (const auto& [name, type] : datatypes) {
    if (name == datatype) return type;
  }
  if (datatype == "BYTES") {
    return absl::InvalidArgumentError(
        "datatype BYTES is not taken by any model here: its elements have no fixed size; send "
        "numbers as one of BOOL, UINT8-64, INT8-64, FP16, FP32, FP64 or BF16");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "datatype \"", clip(datatype),
      "\" is not one the protocol defines: use BOOL, UINT8, UINT16, UINT32, UINT64, INT8, "
      "INT16, INT32, INT64, FP16, FP32, FP64 or BF16"));
}

std::optional<absl::string_view> datatype_of(dtype t) noexcept {
  for (const auto& [name, type] : datatypes) {
    if (type == t) return name;
  }
  return std::nullopt;
}

std::optional<std::uint64_t> element_count(std::span<const std::int64_t> shape) noexcept {
  std::uint64_t count = 1;
  for (const std::int64_t extent : shape) {
    if (extent < 0) return std::nullopt;
    if (__builtin_mul_overflow(count, static_cast<std::uint64_t>(extent), &count)) {
      return std::nullopt;
    }
  }
  return count;
}

std::optional<std::uint64_t> byte_size(dtype type, std::span<const std::int64_t> shape) noexcept {
  const std::optional<std::uint64_t> count = element_count(shape);
  std::uint64_t bytes = 0;
  if (!count || __builtin_mul_overflow(*count, std::uint64_t{type.padded_size()}, &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

absl::Status complete_input(input_tensor& in) {
  const std::string label = absl::StrCat("input ", clip(in.name));
  absl::StatusOr<dtype> type = dtype_of(in.datatype);
  if (!type.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", type.status().message()));
  }
  in.type = *type;
  if (in.shape.size() > max_rank) {
    return absl::InvalidArgumentError(absl::StrCat("shape of ", label, " has ", in.shape.size(),
                                                   " dimensions; at most ", max_rank));
  }
  for (const std::int64_t extent : in.shape) {
    if (extent < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape of ", label, " holds ", extent, ": extents are integers >= 0"));
    }
  }
  const std::optional<std::uint64_t> bytes = byte_size(in.type, in.shape);
  if (!bytes) {
    return absl::InvalidArgumentError(absl::StrCat("shape [", absl::StrJoin(in.shape, ","), "] of ",
                                                   label, " overflows 64 bits in bytes"));
  }
  in.bytes = *bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<shm_ref>> shm_ref_of(const std::string& label,
                                                  std::optional<std::string> region,
                                                  std::optional<std::uint64_t> byte_size,
                                                  std::optional<std::uint64_t> offset) {
  if (!region) {
    if (byte_size || offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(label,
                       " has shared_memory_byte_size or shared_memory_offset but no "
                       "shared_memory_region"));
    }
    return std::nullopt;
  }
  if (!byte_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, " names a shared-memory region but no shared_memory_byte_size"));
  }
  return shm_ref{*std::move(region), offset.value_or(0), *byte_size};
}

absl::Status check_shm_size(const input_tensor& in) {
  if (!in.shm || in.shm->byte_size == in.bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("shared_memory_byte_size of input ", clip(in.name), " is ", in.shm->byte_size,
                   " bytes, but its shape [", absl::StrJoin(in.shape, ","), "] of ", in.datatype,
                   " takes ", in.bytes));
}

std::string clip(absl::string_view text, std::size_t max) {
  if (text.size() <= max) return std::string(text);
  return absl::StrCat(text.substr(0, max), "...");
}

}  // namespace dlasync::examples::kserve
