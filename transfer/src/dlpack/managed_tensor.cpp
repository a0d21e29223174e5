#include "dlasync/transfer/managed_tensor.hpp"

#include <utility>

namespace dlasync {

managed_tensor::managed_tensor(released_tensor t) noexcept {
  if (t.versioned != nullptr) {
    ptr_ = t.versioned;
    versioned_ = true;
  } else {
    ptr_ = t.legacy;
  }
}

managed_tensor::managed_tensor(managed_tensor&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), versioned_(other.versioned_) {}

managed_tensor& managed_tensor::operator=(managed_tensor&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    versioned_ = other.versioned_;
  }
  return *this;
}

DLPackVersion managed_tensor::version() const noexcept {
  if (ptr_ == nullptr || !versioned_) return DLPackVersion{0, 0};
  return versioned()->version;
}

bool managed_tensor::version_supported() const noexcept {
  return ptr_ != nullptr && (!versioned_ || versioned()->version.major <= dlpack_major_version);
}

std::uint64_t managed_tensor::flags() const noexcept {
  return versioned_ && version_supported() ? versioned()->flags : 0;
}

const DLTensor* managed_tensor::dl_tensor() const noexcept {
  if (!version_supported()) return nullptr;
  return versioned_ ? &versioned()->dl_tensor : &legacy()->dl_tensor;
}

released_tensor managed_tensor::release() noexcept {
  released_tensor out;
  if (versioned_) {
    out.versioned = static_cast<DLManagedTensorVersioned*>(std::exchange(ptr_, nullptr));
  } else {
    out.legacy = static_cast<DLManagedTensor*>(std::exchange(ptr_, nullptr));
  }
  return out;
}

void managed_tensor::reset() noexcept {
  void* p = std::exchange(ptr_, nullptr);
  if (p == nullptr) return;
  // The deleter frees the struct too: nothing of it is read afterwards.
  if (versioned_) {
    auto* t = static_cast<DLManagedTensorVersioned*>(p);
    if (t->deleter != nullptr) t->deleter(t);
  } else {
    auto* t = static_cast<DLManagedTensor*>(p);
    if (t->deleter != nullptr) t->deleter(t);
  }
}

}  // namespace dlasync
