// python/src/py_exchange_export.hpp
//
// The DLPack 1.3 C exchange API that `dlasync.Tensor` offers as its type's
// `__dlpack_c_exchange_api__`, so that a consumer that speaks it (tvm-ffi,
// PyTorch's extensions, cuda.core) takes dlasync tensors with no Python call
// a tensor. One static table for the process:
//
//   managed_tensor_from_py_object_no_sync  a new versioned managed tensor
//       sharing the Tensor's memory (READ_ONLY kept), as __dlpack__ gives;
//   dltensor_from_py_object_no_sync  a non-owning DLTensor, valid while the
//       Tensor lives; a read-only Tensor is refused (a DLTensor cannot say so;
//       no Tensor holds padded sub-byte data, which imports refuse);
//   managed_tensor_to_py_object_no_sync  a dlasync.Tensor viewing an owning
//       managed tensor, imported with copy=False on the process's default
//       runtime (the one dlasync.from_dlpack uses), which then owns it; one
//       that would need a copy is refused and goes to its deleter;
//   managed_tensor_allocator  new memory on cpu, cuda or cuda_host from the
//       default runtime, for the prototype's dtype and shape, compact;
//   current_work_stream  NULL: dlasync has no current stream, and a Tensor's
//       data is complete when it is handed out, so any stream may read it.
//
// The refusals are those of `__dlpack__`: a Tensor with negative strides, or
// on a simulated GPU, is a BufferError; an object of another type a
// TypeError. The functions raise (or, the allocator, report through its
// SetError) and return -1; no C++ exception leaves them.
#pragma once

#include <pybind11/pybind11.h>

#include "py_exchange_api.hpp"

namespace dlasync::python {

// The table, and the capsule ("dlpack_exchange_api") that holds it.
const exchange_api* tensor_exchange_api() noexcept;
pybind11::capsule exchange_api_capsule();

}  // namespace dlasync::python
