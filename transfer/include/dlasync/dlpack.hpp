// dlasync/dlpack.hpp
//
// The DLPack ABI as dlasync speaks it: DLPack 1.0-1.3 data, legacy and
// versioned managed tensors. Includes the `dlpack.h` found on the include
// path; when that header is older than 1.0 (Debian ships 0.6), this header
// declares the 1.x types itself with DLPack's exact names and layouts. When a
// newer `dlpack.h` was included first, its declarations are used instead.
//
// Device and type codes newer than the included header are not enumerators
// there, so dlasync never loads `DLDevice::device_type` as an enum: use
// `device_type_code` and `set_device_type_code`, which copy the raw int32.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dlasync/device.hpp"

#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION < 1
#define DLASYNC_DECLARES_DLPACK_V1 1
#ifdef __cplusplus
extern "C" {
#endif
// The version of a versioned managed tensor (DLPack 1.0).
// NOLINTNEXTLINE(modernize-use-using): DLPack's own C declaration
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

// A managed tensor with a version and flags (DLPack 1.0). Everything up to
// and including `flags` keeps its place in later major versions.
// NOLINTNEXTLINE(modernize-use-using): DLPack's own C declaration
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
#ifdef __cplusplus
}
#endif
#endif

#ifndef DLPACK_FLAG_BITMASK_READ_ONLY
#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#endif
#ifndef DLPACK_FLAG_BITMASK_IS_COPIED
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#endif
#ifndef DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)
#endif

static_assert(sizeof(DLDevice) == 8 && alignof(DLDevice) == 4);
static_assert(sizeof(DLDataType) == 4 && alignof(DLDataType) == 2);
static_assert(offsetof(DLDataType, bits) == 1 && offsetof(DLDataType, lanes) == 2);
static_assert(sizeof(DLTensor) == 48);
static_assert(offsetof(DLTensor, device) == 8 && offsetof(DLTensor, ndim) == 16 &&
              offsetof(DLTensor, dtype) == 20 && offsetof(DLTensor, shape) == 24 &&
              offsetof(DLTensor, strides) == 32 && offsetof(DLTensor, byte_offset) == 40);
static_assert(sizeof(DLManagedTensor) == 64);
static_assert(offsetof(DLManagedTensor, manager_ctx) == 48 &&
              offsetof(DLManagedTensor, deleter) == 56);
static_assert(sizeof(DLPackVersion) == 8 && alignof(DLPackVersion) == 4);
static_assert(offsetof(DLPackVersion, minor) == 4);
static_assert(sizeof(DLManagedTensorVersioned) == 80);
static_assert(offsetof(DLManagedTensorVersioned, manager_ctx) == 8 &&
              offsetof(DLManagedTensorVersioned, deleter) == 16 &&
              offsetof(DLManagedTensorVersioned, flags) == 24 &&
              offsetof(DLManagedTensorVersioned, dl_tensor) == 32);

namespace dlasync {

// The DLPack version dlasync reads and writes: majors up to 1, any minor.
inline constexpr std::uint32_t dlpack_major_version = 1;
inline constexpr std::uint32_t dlpack_minor_version = 3;

// Versioned-tensor flags (DLPack 1.0 and 1.1).
inline constexpr std::uint64_t flag_read_only = DLPACK_FLAG_BITMASK_READ_ONLY;
inline constexpr std::uint64_t flag_is_copied = DLPACK_FLAG_BITMASK_IS_COPIED;
inline constexpr std::uint64_t flag_subbyte_padded = DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
inline constexpr std::uint64_t known_flags = flag_read_only | flag_is_copied | flag_subbyte_padded;

// The raw device-type code of `d`, read without loading an enum that may not
// hold the value.
inline std::int32_t device_type_code(const DLDevice& d) noexcept {
  static_assert(sizeof(d.device_type) == sizeof(std::int32_t));
  std::int32_t code;
  std::memcpy(&code, &d.device_type, sizeof code);
  return code;
}

inline void set_device_type_code(DLDevice& d, std::int32_t code) noexcept {
  std::memcpy(&d.device_type, &code, sizeof code);
}

inline device device_from_dl(const DLDevice& d) noexcept {
  return {static_cast<device_kind>(device_type_code(d)), d.device_id};
}

inline DLDevice to_dl_device(device d) noexcept {
  DLDevice out{};
  set_device_type_code(out, static_cast<std::int32_t>(d.kind));
  out.device_id = d.ordinal;
  return out;
}

}  // namespace dlasync
