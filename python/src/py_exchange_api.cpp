#include "py_exchange_api.hpp"

#include <Python.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace py = pybind11;

namespace dlasync::python {
namespace {

constexpr const char* kCapsuleName = "dlpack_exchange_api";
// No table lies in the first page, which is never mapped: an address below
// it is a NULL pointer plus an offset, or a small number.
constexpr std::uintptr_t kFirstPage = 4096;
// Tables a prev_api chain may hold: one a major version, and a handful of
// major versions is all DLPack will ever have at once.
constexpr int kMaxChain = 16;

std::string name_of(py::handle type) {
  return py::str(type.attr("__name__"));
}

std::string version_text(const DLPackVersion& v) {
  return absl::StrCat(v.major, ".", v.minor);
}

// The refusal of `type`'s attribute, as what it raises each time.
struct refusal {
  PyObject* kind;
  std::string message;
};

[[noreturn]] void refuse(const refusal& r) {
  PyErr_SetString(r.kind, r.message.c_str());
  throw py::error_already_set();
}

// Refuses an address no table can have; `what` says where it was found.
void check_address(py::handle type, const char* attr_name, std::uintptr_t address,
                   const std::string& what) {
  const char* wrong = nullptr;
  if (address == 0) {
    wrong = "NULL";
  } else if (address < kFirstPage) {
    wrong = "inside the first page, which is never mapped";
  } else if (address % alignof(exchange_api_header) != 0) {
    wrong = "not aligned to 8 bytes, as a DLPackExchangeAPI is";
  }
  if (wrong == nullptr) return;
  refuse({PyExc_ValueError,
          absl::StrCat("the DLPack C exchange API of ", name_of(type), " is refused: ", what,
                       " is 0x", absl::Hex(address), ", ", wrong,
                       "; the producer must point at its DLPackExchangeAPI (or drop ", attr_name,
                       ", and dlasync uses __dlpack__)")});
}

// The table's address that `attr` holds; 0 when it offers none.
std::uintptr_t address_of(py::handle type, const char* attr_name, const py::object& attr) {
  if (attr.is_none()) return 0;
  std::uintptr_t address = 0;
  if (PyCapsule_CheckExact(attr.ptr()) != 0) {
    const char* name = PyCapsule_GetName(attr.ptr());
    if (name == nullptr && PyErr_Occurred() != nullptr) throw py::error_already_set();
    if (name == nullptr || std::strcmp(name, kCapsuleName) != 0) {
      refuse({PyExc_TypeError, absl::StrCat(attr_name, " of ", name_of(type), " is a capsule ",
                                            name == nullptr ? std::string("with no name (NULL)")
                                                            : absl::StrCat("named \"", name, "\""),
                                            "; the DLPack C exchange API is a capsule named \"",
                                            kCapsuleName, "\"")});
    }
    address = reinterpret_cast<std::uintptr_t>(PyCapsule_GetPointer(attr.ptr(), kCapsuleName));
    check_address(type, attr_name, address, "the capsule's pointer");
  } else if (PyLong_Check(attr.ptr()) != 0 && PyBool_Check(attr.ptr()) == 0) {
    const unsigned long long value = PyLong_AsUnsignedLongLong(attr.ptr());
    if (value == static_cast<unsigned long long>(-1) && PyErr_Occurred() != nullptr) {
      PyErr_Clear();
      refuse({PyExc_ValueError,
              absl::StrCat(attr_name, " of ", name_of(type), " is the int ",
                           std::string(py::str(attr)),
                           ", which is no address: an int form must be the address of the "
                           "producer's DLPackExchangeAPI")});
    }
    address = static_cast<std::uintptr_t>(value);
    check_address(type, attr_name, address, "the int address");
  } else {
    refuse({PyExc_TypeError, absl::StrCat(attr_name, " of ", name_of(type), " is a ",
                                          name_of(py::type::handle_of(attr)),
                                          "; the DLPack C exchange API is a capsule named \"",
                                          kCapsuleName, "\" (or the table's address as an int)")});
  }
  return address;
}

// The version-1 table of the chain that starts at `header`, or nullptr when
// the chain has none (a newer producer that offers no older table).
const exchange_api* usable_table(py::handle type, const char* attr_name,
                                 const exchange_api_header* header) {
  for (int tables = 1;; ++tables) {
    const DLPackVersion v = header->version;
    if (v.major == 0 || (v.major == 1 && v.minor < 3)) {
      refuse({PyExc_ValueError, absl::StrCat("the DLPack C exchange API of ", name_of(type),
                                             " is refused: a table of version ", version_text(v),
                                             ", which has none (it came with DLPack 1.3)")});
    }
    if (v.major == dlpack_major_version) {
      const auto* api = reinterpret_cast<const exchange_api*>(header);
      const char* missing = api->managed_tensor_from_py_object_no_sync == nullptr
                                ? "managed_tensor_from_py_object_no_sync"
                            : api->current_work_stream == nullptr ? "current_work_stream"
                                                                  : nullptr;
      if (missing != nullptr) {
        refuse({PyExc_ValueError,
                absl::StrCat("the DLPack C exchange API of ", name_of(type),
                             " is refused: its version ", version_text(v), " table has ", missing,
                             " NULL, which DLPack requires")});
      }
      return api;
    }
    const exchange_api_header* prev = header->prev_api;
    if (prev == nullptr) return nullptr;
    if (tables == kMaxChain) {
      refuse({PyExc_ValueError,
              absl::StrCat("the DLPack C exchange API of ", name_of(type),
                           " is refused: its prev_api chain runs past ", kMaxChain, " tables")});
    }
    check_address(type, attr_name, reinterpret_cast<std::uintptr_t>(prev),
                  absl::StrCat("prev_api of its version ", version_text(v), " table"));
    if (prev->version.major >= v.major) {
      refuse(
          {PyExc_ValueError, absl::StrCat("the DLPack C exchange API of ", name_of(type),
                                          " is refused: prev_api of its version ", version_text(v),
                                          " table is a version ", version_text(prev->version),
                                          " table; a chain goes to older major versions")});
    }
    header = prev;
  }
}

}  // namespace

const exchange_api* exchange_api_of(py::handle obj) {
  // type -> capsule of the table, None (no table), or (exception, message).
  static auto* by_type = new py::dict();
  // The last type answered, from by_type (which keeps the type alive).
  static PyObject* last_type = nullptr;
  static const exchange_api* last_api = nullptr;
  py::handle type = py::type::handle_of(obj);
  if (type.ptr() == last_type) return last_api;
  if (PyObject* known = PyDict_GetItemWithError(by_type->ptr(), type.ptr())) {
    if (known == Py_None || PyCapsule_CheckExact(known) != 0) {
      last_type = type.ptr();
      last_api = known == Py_None
                     ? nullptr
                     : static_cast<const exchange_api*>(PyCapsule_GetPointer(known, nullptr));
      return last_api;
    }
    PyErr_SetObject(PyTuple_GET_ITEM(known, 0), PyTuple_GET_ITEM(known, 1));
    throw py::error_already_set();
  }
  if (PyErr_Occurred() != nullptr) throw py::error_already_set();
  const exchange_api* api = nullptr;
  try {
    const char* attr_name = kExchangeApiAttr;
    py::object attr = py::getattr(type, attr_name, py::none());
    if (attr.is_none()) {
      attr_name = kOldExchangeApiAttr;
      attr = py::getattr(type, attr_name, py::none());
    }
    // The int form's promise, taken once its value passed the checks.
    const auto* header =
        // NOLINTNEXTLINE(performance-no-int-to-ptr)
        reinterpret_cast<const exchange_api_header*>(address_of(type, attr_name, attr));
    if (header != nullptr) api = usable_table(type, attr_name, header);
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_TypeError) || e.matches(PyExc_ValueError)) {
      (*by_type)[type] = py::make_tuple(e.type(), py::str(e.value()));
    }
    throw;
  }
  (*by_type)[type] = api == nullptr ? py::object(py::none())
                                    : py::object(py::capsule(const_cast<exchange_api*>(api)));
  return api;
}

}  // namespace dlasync::python
