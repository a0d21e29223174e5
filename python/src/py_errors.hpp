// python/src/py_errors.hpp
//
// dlasync's statuses as the array-API standard's exceptions, with
// dlasync's message and the import's facts as attributes:
//
//   BufferError   the tensor cannot be taken as it is: a device this process
//                 cannot serve or that is not where the tensor says, a layout,
//                 dtype or version dlasync refuses;
//   ValueError    an argument is wrong (options, streams), or copy=False when
//                 a copy is needed (rule "copy", as the standard's from_dlpack
//                 says);
//   MemoryError   a copy larger than the whole copy budget, memory that ran
//                 out;
//   RuntimeError  the runtime is shutting down or shut down during the
//                 import (Cancelled), a CUDA call failed.
//
// A cancelled asyncio task raises asyncio.CancelledError as usual; the
// import's own Cancelled status never reaches it.
//
// Every exception made here has `code` (abseil's code name,
// "FAILED_PRECONDITION"), `rule` (import_error.hpp's rule, or ""),
// `consumed` (whether the producer's tensor was taken) and `copy_reasons`.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <new>

#include "absl/status/status.h"

namespace dlasync::python {

// The exception `status` (not OK) becomes, ready to raise or to hand to a
// future.
pybind11::object make_exception(const absl::Status& status);

// Raises make_exception(status).
[[noreturn]] void raise_status(const absl::Status& status);

// Runs `body` where no C++ exception may leave (a C function, a raw CPython
// method), turning what it throws into the Python error indicator, as
// pybind11's dispatcher does: true when it returned, false with an
// exception set.
template <typename Body>
bool python_errors_of(Body&& body) noexcept {
  // The outer handler also takes what the inner ones might throw.
  try {
    try {
      body();
      return true;
    } catch (pybind11::error_already_set& e) {
      e.restore();
    } catch (pybind11::builtin_exception& e) {
      e.set_error();  // cast_error too: a RuntimeError
    } catch (std::bad_alloc&) {
      PyErr_NoMemory();
    } catch (std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "dlasync: an unknown C++ exception");
  }
  return false;
}

}  // namespace dlasync::python
