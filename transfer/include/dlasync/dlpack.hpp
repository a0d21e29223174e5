// dlasync/dlpack.hpp
//
// The DLPack ABI as dlasync speaks it: DLPack 1.0-1.3 data, legacy and
// versioned managed tensors, and `dlasync::managed_tensor`, the handle that
// owns a producer's managed tensor until an import takes it (below). Includes the `dlpack.h` found on the include
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
#include <utility>

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

// `dlasync::managed_tensor` owns one DLPack managed tensor, legacy
// (`DLManagedTensor*`) or versioned (`DLManagedTensorVersioned*`), and calls
// its deleter exactly once: when the handle is destroyed or reset, unless the
// pointer was given back with `release()`. A NULL deleter is legal and means
// there is nothing to free.
//
// Example:
//
//   dlasync::managed_tensor t(producer_export());   // takes ownership
//   if (!dlasync::validate_dlpack(t, options, registry).ok()) {
//     return give_back(t.release());                 // the producer owns it again
//   }
//
// The handle is move-only. Accessors never read past the version of a tensor
// whose major version is newer than dlasync understands: only the version and
// the deleter keep their place across major versions.
//
// Thread safety: distinct objects are safe; a shared object is unsafe.

// What `managed_tensor::release()` gives back: at most one pointer is set.
struct released_tensor {
  DLManagedTensor* legacy = nullptr;
  DLManagedTensorVersioned* versioned = nullptr;
};

class managed_tensor {
 public:
  managed_tensor() noexcept = default;
  // Takes ownership of `t`; NULL gives an empty handle.
  explicit managed_tensor(DLManagedTensor* t) noexcept : ptr_(t), versioned_(false) {}
  explicit managed_tensor(DLManagedTensorVersioned* t) noexcept : ptr_(t), versioned_(true) {}
  // Takes ownership of whichever pointer `t` holds.
  explicit managed_tensor(released_tensor t) noexcept;

  managed_tensor(managed_tensor&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), versioned_(other.versioned_) {}
  managed_tensor& operator=(managed_tensor&& other) noexcept {
    if (this != &other) {
      reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      versioned_ = other.versioned_;
    }
    return *this;
  }
  managed_tensor(const managed_tensor&) = delete;
  managed_tensor& operator=(const managed_tensor&) = delete;
  ~managed_tensor() { reset(); }

  bool empty() const noexcept { return ptr_ == nullptr; }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }
  bool is_versioned() const noexcept { return versioned_; }

  // The producer's version; legacy tensors report 0.0.
  DLPackVersion version() const noexcept {
    if (ptr_ == nullptr || !versioned_) return DLPackVersion{0, 0};
    return versioned()->version;
  }

  // False for a versioned tensor whose major version is above
  // `dlpack_major_version`: nothing but its version may then be read.
  bool version_supported() const noexcept {
    return ptr_ != nullptr && (!versioned_ || versioned()->version.major <= dlpack_major_version);
  }

  // The versioned flags; 0 for legacy tensors and unsupported versions.
  std::uint64_t flags() const noexcept {
    return versioned_ && version_supported() ? versioned()->flags : 0;
  }

  // The tensor description, or nullptr when empty or the version is not
  // supported.
  const DLTensor* dl_tensor() const noexcept {
    if (!version_supported()) return nullptr;
    return versioned_ ? &versioned()->dl_tensor : &legacy()->dl_tensor;
  }

  DLManagedTensor* legacy() const noexcept {
    return versioned_ ? nullptr : static_cast<DLManagedTensor*>(ptr_);
  }
  DLManagedTensorVersioned* versioned() const noexcept {
    return versioned_ ? static_cast<DLManagedTensorVersioned*>(ptr_) : nullptr;
  }

  // Gives the pointer back without calling the deleter; the handle is empty
  // afterwards.
  released_tensor release() noexcept;

  // Calls the deleter (when there is one) and empties the handle.
  void reset() noexcept {
    if (ptr_ != nullptr) call_deleter();
  }

 private:
  // Empties the handle and calls the deleter, when there is one.
  void call_deleter() noexcept;

  void* ptr_ = nullptr;
  bool versioned_ = false;
};

}  // namespace dlasync
