// How imports make tensors (internal): views of a consumed source, and
// copies that own a buffer.
#pragma once

#include <atomic>
#include <memory>

#include <cstdint>
#include <span>

#include "dlasync/device_buffer.hpp"
#include "dlasync/dlpack.hpp"
#include "dlasync/memory_budget.hpp"
#include "dlasync/tensor.hpp"
#include "dlasync/validate.hpp"

namespace dlasync::detail {

struct tensor_factory {
  // A view of `source`'s memory as `plan` (from plan_import on `source`)
  // describes, on `plan.target`. Takes ownership of `source`.
  static tensor make_view(managed_tensor source, const import_plan& plan);

  // A compact row-major tensor of extents `shape` owning `buffer`, which
  // holds `plan`'s elements on `plan.target`.
  // `stream`: a GPU copy's free stream (backend::allocate's slot), or null.
  // `budget`: where the tensor gives `plan.byte_size` back once its buffer
  // is freed, or null when the buffer's own release does.
  static tensor make_copy(device_buffer buffer, const import_plan& plan,
                          std::span<const std::int64_t> shape,
                          std::shared_ptr<std::atomic<std::int64_t>> stream = nullptr,
                          std::shared_ptr<memory_budget> budget = nullptr);
};

}  // namespace dlasync::detail
