// python/src/py_tensor.hpp
//
// `dlasync.Tensor`: an imported tensor as Python sees it. It owns a
// reference to the tensor's state (a view keeps the producer's tensor, a
// copy its buffer) and a reference to the Runtime that imported it, which
// makes copies for `__dlpack__(copy=True)` and `dl_device=`.
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

void bind_device(pybind11::module_& m);
void bind_tensor(pybind11::module_& m);

}  // namespace dlasync::python
