#include "py_fastcall.hpp"

#include <Python.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "py_errors.hpp"
#include "py_runtime.hpp"

namespace py = pybind11;

namespace dlasync::python {
namespace {

const py::detail::type_info* runtime_info = nullptr;

// The keywords, interned: compared by identity first, as CPython does.
struct keywords {
  PyObject* device = PyUnicode_InternFromString("device");
  PyObject* copy = PyUnicode_InternFromString("copy");
  PyObject* stream = PyUnicode_InternFromString("stream");
  PyObject* require_contiguous = PyUnicode_InternFromString("require_contiguous");
  PyObject* require_writable = PyUnicode_InternFromString("require_writable");
};

const keywords& names() {
  static const auto* k = new keywords();
  return *k;
}

// The keyword `key` names: the interned string itself (the interpreter
// interns the keywords of a call written in Python), else an equal string.
// Identity is tried against every name first, as a comparison costs about
// as much as the rest of the parse.
PyObject* keyword_of(const keywords& k, PyObject* key) {
  PyObject* const all[] = {k.device, k.copy, k.stream, k.require_contiguous, k.require_writable};
  for (PyObject* name : all) {
    if (key == name) return name;
  }
  for (PyObject* name : all) {
    if (PyUnicode_Compare(key, name) == 0) return name;
  }
  if (PyErr_Occurred() != nullptr) PyErr_Clear();  // not a string: named below
  return nullptr;
}

py_runtime& runtime_of(PyObject* self) {
  // The method descriptor has checked that self is a Runtime.
  auto* inst = reinterpret_cast<py::detail::instance*>(self);
  if (inst->simple_layout) {
    // One pybind11 base (dlasync.Runtime is a Python subclass of it): the
    // value is in place, with no search through the type's bases.
    if (!inst->simple_holder_constructed || inst->simple_value_holder[0] == nullptr) {
      throw py::type_error("this dlasync.Runtime was not initialized: its __init__ did not run");
    }
    return *static_cast<py_runtime*>(inst->simple_value_holder[0]);
  }
  auto* rt = inst->get_value_and_holder(runtime_info).value_ptr<py_runtime>();
  if (rt == nullptr) {
    throw py::type_error("this dlasync.Runtime was not initialized: its __init__ did not run");
  }
  return *rt;
}

// The positional arguments (exactly `positional` of them) and the import's
// keywords of a call named `name`.
import_args parse(const char* name, const char* positional_names, Py_ssize_t positional,
                  PyObject* const* args, Py_ssize_t nargsf, PyObject* kwnames) {
  const Py_ssize_t given = PyVectorcall_NARGS(nargsf);
  if (given != positional) {
    throw py::type_error(absl::StrCat(name, "() takes ", positional, " positional argument",
                                      positional == 1 ? "" : "s", " (", positional_names, "), ",
                                      given, " given"));
  }
  import_args a;
  const keywords& k = names();
  const Py_ssize_t n = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, i);
    auto value = py::reinterpret_borrow<py::object>(args[positional + i]);
    PyObject* keyword = keyword_of(k, key);
    if (keyword == k.device) {
      a.device = std::move(value);
    } else if (keyword == k.copy) {
      a.copy = std::move(value);
    } else if (keyword == k.stream) {
      a.stream = std::move(value);
    } else if (keyword == k.require_contiguous) {
      a.require_contiguous = std::move(value);
    } else if (keyword == k.require_writable) {
      a.require_writable = std::move(value);
    } else {
      throw py::type_error(absl::StrCat(name, "() got an unexpected keyword argument '",
                                        std::string(py::str(key)),
                                        "'; it takes device, copy, stream, "
                                        "require_contiguous and require_writable"));
    }
  }
  return a;
}

PyObject* from_dlpack(PyObject* self, PyObject* const* args, Py_ssize_t nargsf, PyObject* kwnames) {
  PyObject* result = nullptr;
  python_errors_of([&] {
    const import_args a = parse("from_dlpack", "x", 1, args, nargsf, kwnames);
    py_runtime& rt = runtime_of(self);
    result = rt.from_dlpack(py::reinterpret_borrow<py::object>(self), args[0], a).release().ptr();
  });
  return result;
}

PyObject* start_import(PyObject* self, PyObject* const* args, Py_ssize_t nargsf,
                       PyObject* kwnames) {
  PyObject* result = nullptr;
  python_errors_of([&] {
    const import_args a = parse("_start_import", "x, loop", 2, args, nargsf, kwnames);
    py_runtime& rt = runtime_of(self);
    result = rt.start_import(py::reinterpret_borrow<py::object>(self), args[0], a, args[1])
                 .release()
                 .ptr();
  });
  return result;
}

void add_method(py::handle type, PyMethodDef* def) {
  auto descr = py::reinterpret_steal<py::object>(
      PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(type.ptr()), def));
  if (!descr) throw py::error_already_set();
  if (PyObject_SetAttrString(type.ptr(), def->ml_name, descr.ptr()) != 0) {
    throw py::error_already_set();
  }
}

}  // namespace

void add_fast_imports(py::handle runtime_type, const char* from_dlpack_doc) {
  runtime_info = py::detail::get_type_info(typeid(py_runtime));
  // They live for the process, as a type's method table does.
  static PyMethodDef from_dlpack_def = {
      "from_dlpack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&from_dlpack)),
      METH_FASTCALL | METH_KEYWORDS, from_dlpack_doc};
  static PyMethodDef start_import_def = {
      "_start_import", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&start_import)),
      METH_FASTCALL | METH_KEYWORDS,
      "_start_import($self, x, loop, /, *, device=None, copy=None, stream=None, "
      "require_contiguous=False, require_writable=False)\n--\n\n"
      "Starts import_dlpack's import on `loop`: a Tensor when it was made at once (a view), "
      "else (call, future)."};
  add_method(runtime_type, &from_dlpack_def);
  add_method(runtime_type, &start_import_def);
}

}  // namespace dlasync::python
