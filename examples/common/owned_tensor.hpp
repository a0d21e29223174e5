// Example support: DLPack tensors over memory that the example owns.
//
// `make_managed` wraps memory as a DLManagedTensorVersioned whose deleter
// drops `keep`, the owner of that memory: a network buffer, a pinned block,
// anything a shared_ptr can hold. This is what a producer (a framework, a
// network stack) does when it hands a tensor to dlasync.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dlasync/dlasync.hpp"

namespace dlasync::examples {

// A versioned managed tensor (DLPack 1.x) of `type` and `shape` at `data` on
// `where`. Empty `strides` means compact row-major (NULL strides). The
// deleter releases `keep`; the caller owns the result.
managed_tensor make_managed(std::shared_ptr<void> keep, void* data, dtype type,
                            std::span<const std::int64_t> shape,
                            std::span<const std::int64_t> strides, device where,
                            std::uint64_t flags = 0);

}  // namespace dlasync::examples
