// dlasync/detail/tensor_state.hpp
//
// The shared state behind `dlasync::tensor`: the description, plus whatever
// keeps the memory alive (a derived type: the producer's managed tensor for a
// view, an allocation for a copy). One allocation holds both.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/container/inlined_vector.h"
#include "dlasync/device.hpp"
#include "dlasync/dtype.hpp"

namespace dlasync {

enum class tensor_storage : std::uint8_t {
  view,  // the producer's memory, kept alive by its managed tensor
  copy,  // memory that dlasync allocated and owns
};

namespace detail {

struct tensor_state {
  virtual ~tensor_state() = default;

  dlasync::device device;
  dlasync::dtype type;
  std::int32_t ndim = 0;
  tensor_storage storage = tensor_storage::view;
  bool read_only = false;
  bool compact = true;
  std::uint64_t flags = 0;
  void* data = nullptr;  // as in DLTensor: the first element is at data + byte_offset
  std::uint64_t byte_offset = 0;
  std::int64_t element_count = 0;
  std::uint64_t byte_size = 0;
  // ndim extents, then ndim strides in elements.
  absl::InlinedVector<std::int64_t, 8> dims;
  // A GPU copy's stream (DLPack encoding), on which its memory is freed;
  // null for views and host copies.
  std::shared_ptr<std::atomic<std::int64_t>> stream;
};

}  // namespace detail
}  // namespace dlasync
