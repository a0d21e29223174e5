// dlasync/managed_tensor.hpp
//
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
#pragma once

#include <cstdint>
#include <utility>

#include "dlasync/dlpack.hpp"

namespace dlasync {

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
