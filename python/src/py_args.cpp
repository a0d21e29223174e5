#include "py_args.hpp"

#include "absl/status/status.h"
#include "dlasync/dlpack_stream.hpp"
#include "dlasync/import.hpp"
#include "py_errors.hpp"

namespace py = pybind11;

namespace dlasync::python {
namespace {

constexpr std::size_t kReprLimit = 80;

constexpr const char* kStreamValues =
    "DLPack's encoding: a cudaStream_t as an int, 1 for the legacy default stream, 2 for the "
    "per-thread default, -1 for no synchronization; or None";

// The kinds whose memory CUDA orders with streams.
bool has_streams(device_kind kind) {
  return kind == device_kind::cuda || kind == device_kind::cuda_host ||
         kind == device_kind::cuda_managed;
}

}  // namespace

void refuse_stream(const std::string& message) {
  raise_status(with_import_error(absl::InvalidArgumentError(message), {false, "stream", ""}));
}

std::string seen(py::handle h) {
  const std::string type = py::str(py::type::handle_of(h).attr("__name__"));
  try {
    std::string text = py::repr(h);
    if (text.size() > kReprLimit) text = absl::StrCat(text.substr(0, kReprLimit - 3), "...");
    return absl::StrCat(text, " of type ", type);
  } catch (const py::error_already_set&) {
    return absl::StrCat("a ", type, " (whose repr raised)");
  }
}

void raise_out_of_range(py::handle value, const char* name, const char* expected) {
  throw py::value_error(absl::StrCat(name, "=", std::string(py::repr(value)),
                                     " is out of range: it takes ", expected));
}

std::optional<bool> copy_arg(py::handle copy) {
  if (copy.is_none()) return std::nullopt;
  if (PyBool_Check(copy.ptr()) == 0) {
    throw py::type_error(absl::StrCat(
        "copy takes True, False or None (the array API standard's Optional[bool]); got ",
        seen(copy), ": pass bool(value) if a truth value is meant"));
  }
  return copy.ptr() == Py_True;
}

bool flag_arg(py::handle value, const char* name) {
  if (PyBool_Check(value.ptr()) == 0) {
    throw py::type_error(absl::StrCat(name, " takes True or False; got ", seen(value)));
  }
  return value.ptr() == Py_True;
}

std::optional<std::int64_t> stream_arg(py::handle stream) {
  if (stream.is_none()) return std::nullopt;
  if (!is_int(stream)) {
    throw py::type_error(
        absl::StrCat("stream takes an int in ", kStreamValues, "; got ", seen(stream)));
  }
  int overflow = 0;
  const long long s = PyLong_AsLongLongAndOverflow(stream.ptr(), &overflow);
  if (overflow != 0) {
    refuse_stream(absl::StrCat(
        "stream ", std::string(py::repr(stream)),
        " does not fit in 64 bits, so it is no cudaStream_t; pass an int in ", kStreamValues));
  }
  if (s == 0) {
    refuse_stream(absl::StrCat(
        "stream 0 is ambiguous, and DLPack forbids it (it could mean None, 1 or 2); pass 1 for "
        "the legacy default stream, 2 for the per-thread default, or None"));
  }
  if (s < stream_no_sync) {
    refuse_stream(absl::StrCat("stream ", s, " is not a DLPack stream value; pass an int in ",
                               kStreamValues));
  }
  return s;
}

std::optional<std::int64_t> stream_for(device_kind kind, std::int64_t s, const std::string& what) {
  if (has_streams(kind)) return s;
  if (s == stream_no_sync) return std::nullopt;
  refuse_stream(absl::StrCat("stream ", s, " was given for ", what, ": ",
                             kind == device_kind::cpu
                                 ? std::string("host memory has no streams")
                                 : absl::StrCat(device_kind_name(kind),
                                                " memory has no CUDA streams, the only ones "
                                                "dlasync follows"),
                             "; pass stream=None (or -1)"));
}

std::optional<DLPackVersion> max_version_arg(py::handle max_version) {
  if (max_version.is_none()) return std::nullopt;
  constexpr const char* expected = "None or a (major, minor) tuple of two ints, such as (1, 3)";
  if (!py::isinstance<py::tuple>(max_version) || py::len(max_version) != 2) {
    throw py::type_error(absl::StrCat("max_version takes ", expected, "; got ", seen(max_version)));
  }
  const auto t = py::reinterpret_borrow<py::tuple>(max_version);
  if (!is_int(t[0]) || !is_int(t[1])) {
    throw py::type_error(absl::StrCat("max_version takes ", expected, "; got ", seen(max_version)));
  }
  constexpr const char* range = "a (major, minor) tuple of ints in [0, 2^32), such as (1, 3)";
  return DLPackVersion{int_arg<std::uint32_t>(t[0], "max_version's major", range),
                       int_arg<std::uint32_t>(t[1], "max_version's minor", range)};
}

}  // namespace dlasync::python
