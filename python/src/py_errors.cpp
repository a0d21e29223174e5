#include "py_errors.hpp"

#include <Python.h>

#include <optional>
#include <string>

#include "dlasync/import.hpp"

namespace py = pybind11;

namespace dlasync::python {
namespace {

// The rules whose refusals are ValueErrors: a wrong argument, and copy=False
// when a copy is needed (the array API standard's from_dlpack: "ValueError:
// if data exchange is possible via an explicit copy but copy is set to False").
bool is_value_error_rule(const std::string& rule) {
  return rule == "options" || rule == "stream" || rule == "consumer_stream" || rule == "copy";
}

PyObject* exception_type(const absl::Status& status, const std::optional<import_error>& why) {
  const std::string rule = why ? why->rule : std::string();
  switch (status.code()) {
    case absl::StatusCode::kResourceExhausted: return PyExc_MemoryError;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDataLoss: return PyExc_RuntimeError;
    default: break;
  }
  if (is_value_error_rule(rule)) return PyExc_ValueError;
  if (!rule.empty()) return PyExc_BufferError;
  // Not an import's refusal (a CUDA error in flight, an export): by code.
  if (status.code() == absl::StatusCode::kInvalidArgument ||
      status.code() == absl::StatusCode::kOutOfRange) {
    return PyExc_ValueError;
  }
  if (status.code() == absl::StatusCode::kFailedPrecondition) return PyExc_BufferError;
  return PyExc_RuntimeError;
}

}  // namespace

py::object make_exception(const absl::Status& status) {
  const std::optional<import_error> why = import_error_of(status);
  py::handle type = exception_type(status, why);
  py::object e = type(std::string(status.message()));
  e.attr("code") = absl::StatusCodeToString(status.code());
  e.attr("rule") = why ? why->rule : std::string();
  e.attr("consumed") = why ? why->consumed : false;
  e.attr("copy_reasons") = why ? why->copy_reasons : std::string();
  return e;
}

void raise_status(const absl::Status& status) {
  py::object e = make_exception(status);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
  throw py::error_already_set();
}

}  // namespace dlasync::python
