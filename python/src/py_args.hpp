// python/src/py_args.hpp
//
// The checks of what Python passes to dlasync: one rule for
// `Tensor.__dlpack__` and the importing functions alike, as the array API
// standard types the arguments. A wrong type is a TypeError, a wrong value
// a ValueError, each naming the value seen and what to pass instead. An
// argument is checked here before any pybind11 cast could fail on it, so no
// pybind11 message ("Unable to cast Python instance ...") reaches a user.
//
//   copy          True, False or None (the standard's Optional[bool]); an
//                 int, numpy.bool_ or an array is a TypeError
//   stream        None or a Python int (not a bool) in DLPack's encoding:
//                 -1 (no synchronization), 1 (legacy default), 2 (per-thread
//                 default) or a stream handle; 0, below -1 or beyond 64 bits
//                 is a ValueError
//   max_version   None or a (major, minor) tuple of two ints, each in
//                 [0, 2^32)
//
// A stream is then checked against the memory it would order: only CUDA's
// memory (cuda, cuda_host, cuda_managed) has streams; for any other memory
// a stream other than -1 is a ValueError, and -1 means none.
#pragma once

#include <pybind11/pybind11.h>

#include <Python.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "dlasync/device.hpp"
#include "dlasync/dlpack.hpp"

namespace dlasync::python {

// True for a Python int; a bool (an int to Python) is not one here.
inline bool is_int(pybind11::handle h) {
  return PyLong_Check(h.ptr()) != 0 && PyBool_Check(h.ptr()) == 0;
}

// "array([1, 2, 3]) of type ndarray": the value seen, for messages (its
// repr cut at 80 characters, or its type alone when the repr raises).
std::string seen(pybind11::handle h);

// Raises ValueError "`name`=<value> is out of range: it takes `expected`".
[[noreturn]] void raise_out_of_range(pybind11::handle value, const char* name,
                                     const char* expected);

// The int `value` holds as a T: TypeError when it is no int, ValueError
// when T cannot hold it. `expected` ends the messages ("an int in [0, 2^64)").
template <typename T>
T int_arg(pybind11::handle value, const char* name, const char* expected) {
  static_assert(std::is_integral_v<T> && sizeof(T) <= sizeof(long long));
  if (!is_int(value)) {
    throw pybind11::type_error(absl::StrCat(name, " takes ", expected, "; got ", seen(value)));
  }
  if constexpr (std::is_unsigned_v<T>) {
    const unsigned long long v = PyLong_AsUnsignedLongLong(value.ptr());
    if (PyErr_Occurred() != nullptr) {  // negative, or past 64 bits
      PyErr_Clear();
      raise_out_of_range(value, name, expected);
    }
    if (v > std::numeric_limits<T>::max()) raise_out_of_range(value, name, expected);
    return static_cast<T>(v);
  } else {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow != 0 || v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
      raise_out_of_range(value, name, expected);
    }
    return static_cast<T>(v);
  }
}

// `copy=`: nullopt for None.
std::optional<bool> copy_arg(pybind11::handle copy);

// A keyword that takes True or False (require_contiguous=, ...).
bool flag_arg(pybind11::handle value, const char* name);

// Raises ValueError `message` with the facts of an import's refusal by
// rule "stream" (not consumed).
[[noreturn]] void refuse_stream(const std::string& message);

// `stream=`: nullopt for None. Its ValueErrors carry the import's facts
// (rule "stream", not consumed), as the runtime's own refusal does.
std::optional<std::int64_t> stream_arg(pybind11::handle stream);

// The stream to use for memory of `kind`: `s` for CUDA's memory, nullopt
// for -1 elsewhere; ValueError (rule "stream") for any other stream given
// for memory that has none. `what` names the tensor ("a ndarray on cpu:0").
std::optional<std::int64_t> stream_for(device_kind kind, std::int64_t s, const std::string& what);

// `max_version=`: nullopt for None.
std::optional<DLPackVersion> max_version_arg(pybind11::handle max_version);

}  // namespace dlasync::python
