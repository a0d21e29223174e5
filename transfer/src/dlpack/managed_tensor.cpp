#include "dlasync/dlpack.hpp"

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

released_tensor managed_tensor::release() noexcept {
  released_tensor out;
  if (versioned_) {
    out.versioned = static_cast<DLManagedTensorVersioned*>(std::exchange(ptr_, nullptr));
  } else {
    out.legacy = static_cast<DLManagedTensor*>(std::exchange(ptr_, nullptr));
  }
  return out;
}

void managed_tensor::call_deleter() noexcept {
  void* p = std::exchange(ptr_, nullptr);
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
