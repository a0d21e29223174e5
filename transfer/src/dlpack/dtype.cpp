#include "dlasync/dtype.hpp"

#include "absl/strings/str_cat.h"

namespace dlasync {
namespace {

struct code_info {
  const char* name;         // family name, "float", "float8_e4m3fn"
  bool name_has_bits;       // "float" + "32", but "float8_e4m3fn" alone
  std::uint8_t allowed[4];  // valid bit widths, 0-terminated
};

constexpr code_info code_table[] = {
    {"int", true, {8, 16, 32, 64}},    {"uint", true, {8, 16, 32, 64}},
    {"float", true, {16, 32, 64, 0}},  {"opaque_handle", true, {0}},
    {"bfloat", true, {16, 0}},         {"complex", true, {64, 128, 0}},
    {"bool", false, {8, 0}},           {"float8_e3m4", false, {8, 0}},
    {"float8_e4m3", false, {8, 0}},    {"float8_e4m3b11fnuz", false, {8, 0}},
    {"float8_e4m3fn", false, {8, 0}},  {"float8_e4m3fnuz", false, {8, 0}},
    {"float8_e5m2", false, {8, 0}},    {"float8_e5m2fnuz", false, {8, 0}},
    {"float8_e8m0fnu", false, {8, 0}}, {"float6_e2m3fn", false, {6, 0}},
    {"float6_e3m2fn", false, {6, 0}},  {"float4_e2m1fn", false, {4, 0}},
};

constexpr std::size_t code_count = sizeof(code_table) / sizeof(code_table[0]);

bool bits_allowed(const code_info& info, std::uint8_t bits) {
  for (std::uint8_t allowed : info.allowed) {
    if (allowed != 0 && allowed == bits) return true;
  }
  return false;
}

std::string allowed_list(const code_info& info) {
  std::string out;
  for (std::uint8_t allowed : info.allowed) {
    if (allowed == 0) break;
    absl::StrAppend(&out, out.empty() ? "" : ", ", allowed);
  }
  return out;
}

}  // namespace

std::string dtype::name() const {
  if (code >= code_count || !bits_allowed(code_table[code], bits)) {
    return absl::StrCat("dtype(code=", code, ", bits=", bits, ", lanes=", lanes, ")");
  }
  const code_info& info = code_table[code];
  std::string out = info.name;
  if (info.name_has_bits) absl::StrAppend(&out, bits);
  if (lanes != 1) absl::StrAppend(&out, "x", lanes);
  return out;
}

std::ostream& operator<<(std::ostream& os, const dtype& t) {
  return os << t.name();
}

absl::Status check_dtype(dtype t, std::uint64_t flags) {
  if (t.code >= code_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype code ", t.code, " is not a DLPack type code (known: 0-", code_count - 1,
                     "); the producer speaks a newer DLPack or wrote a corrupt DLDataType"));
  }
  const code_info& info = code_table[t.code];
  if (t.code == static_cast<std::uint8_t>(dtype_code::opaque_handle)) {
    return absl::UnimplementedError(absl::StrCat(
        "dtype opaque_handle (code 3, bits ", t.bits,
        ") cannot be imported: its elements are handles whose meaning only the producer "
        "knows; export plain data instead"));
  }
  if (!bits_allowed(info, t.bits)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype code ", t.code, " (", info.name, ") with ", t.bits,
        " bits is not valid; DLPack allows ", allowed_list(info), " bits for ", info.name));
  }
  if (t.lanes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype ", t.name(), " has 0 lanes; a DLPack dtype has at least one lane: export lanes=1"));
  }
  if (t.lanes != 1) {
    return absl::UnimplementedError(absl::StrCat(
        "dtype ", t.name(), " has ", t.lanes,
        " lanes; vector dtypes are not supported: export lanes=1 with a trailing dimension of ",
        t.lanes, " instead"));
  }
  if (t.is_sub_byte() && (flags & flag_subbyte_padded) != 0) {
    return absl::UnimplementedError(
        absl::StrCat("dtype ", t.name(),
                     " is padded to one byte an element (flag IS_SUBBYTE_TYPE_PADDED); only packed "
                     "sub-byte data is supported: export it packed, or as uint8"));
  }
  return absl::OkStatus();
}

}  // namespace dlasync
