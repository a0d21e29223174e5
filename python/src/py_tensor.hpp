// python/src/py_tensor.hpp
//
// `dlasync.Tensor`: an imported tensor as Python sees it. It owns a
// reference to the tensor's state (a view keeps the producer's tensor, a
// copy its buffer) and a reference to the Runtime that imported it, which
// makes copies for `__dlpack__(copy=True)` and `dl_device=`. The type offers
// DLPack 1.3's C exchange API (py_exchange_export.hpp).
#pragma once

#include <pybind11/pybind11.h>

#include "dlasync/tensor.hpp"

namespace dlasync::python {

// `dlasync.Device`.
struct py_device {
  device value;
};

struct py_tensor {
  tensor value;
  pybind11::object owner;  // the dlasync Runtime (Python object)
};

// The Tensor type without pybind11's lookup by C++ type on every call (a
// hash of the type's name): for the per-call path. Ready once bind_tensor ran.
bool is_tensor(pybind11::handle obj) noexcept;
// `obj` must be a Tensor (is_tensor); TypeError for one that holds no
// tensor (made with Tensor.__new__).
const py_tensor& tensor_of(pybind11::handle obj);
pybind11::object make_tensor(py_tensor&& t);

// Raises BufferError for a tensor no other library may take as it is: one
// with negative strides, or one on a simulated GPU.
void check_exportable(const py_tensor& self);

void bind_device(pybind11::module_& m);
void bind_tensor(pybind11::module_& m);

}  // namespace dlasync::python
