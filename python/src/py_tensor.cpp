#include "py_tensor.hpp"

#include <Python.h>
#include <structmember.h>

#include <cstddef>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "py_args.hpp"
#include "py_errors.hpp"
#include "py_exchange_api.hpp"
#include "py_exchange_export.hpp"
#include "py_runtime.hpp"
#include "py_source.hpp"

namespace py = pybind11;

namespace dlasync::python {
namespace {

py::tuple as_tuple(std::span<const std::int64_t> values) {
  py::tuple out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return out;
}

bool is_simulated(const py_tensor& t) {
  if (!is_gpu_memory(t.value.device().kind)) return false;
  return t.owner.cast<py_runtime&>().get().is_simulated(t.value.device());
}

bool has_negative_stride(const tensor& t) {
  for (std::int32_t d = 0; d < t.ndim(); ++d) {
    if (t.strides()[d] < 0 && t.shape()[d] > 1) return true;
  }
  return false;
}

std::string strides_text(const tensor& t) {
  std::string out;
  for (std::int64_t s : t.strides()) absl::StrAppend(&out, out.empty() ? "" : ", ", s);
  return out;
}

// Tensor.__dlpack__ as the Python array API specifies it.
py::capsule dlpack(const py_tensor& self, const py::object& stream, const py::object& max_version,
                   const py::object& dl_device, const py::object& copy) {
  const tensor& t = self.value;
  const device own = t.device();
  const std::optional<DLPackVersion> version = max_version_arg(max_version);
  const bool versioned = version && version->major >= 1;
  // The tensor's data is complete when it is handed out (dlasync's imports
  // resume once the copy has run), so a consumer's stream needs nothing;
  // it is checked all the same, as an import checks it.
  if (const std::optional<std::int64_t> s = stream_arg(stream)) {
    stream_for(own.kind, *s, absl::StrCat("a dlasync.Tensor on ", own.name()));
  }
  std::optional<device> target;
  if (!dl_device.is_none()) target = parse_device(dl_device);
  const std::optional<bool> want_copy = copy_arg(copy);
  const bool moves = target && *target != own;
  if (moves && want_copy == false) {
    throw py::buffer_error(absl::StrCat("the tensor lives on ", own.name(), "; ", target->name(),
                                        " was asked for with copy=False, which needs a copy: "
                                        "pass copy=None or copy=True"));
  }
  if (moves || want_copy == true) {
    absl::StatusOr<DLManagedTensorVersioned*> own_export = t.to_dlpack_versioned();
    if (!own_export.ok()) raise_status(own_export.status());
    import_options o;
    o.target = target ? *target : own;
    o.copy = true;
    py::object copied =
        self.owner.cast<py_runtime&>().import_managed(self.owner, managed_tensor(*own_export), o);
    const py_tensor& c = tensor_of(copied);
    if (is_simulated(c)) {
      throw py::buffer_error(absl::StrCat(
          c.value.device().name(),
          " is a simulated GPU; its memory is host memory that only "
          "dlasync reads as device memory: import it with dlasync, or copy it to the host"));
    }
    // The standard: when a copy happens, IS_COPIED must be set.
    return export_capsule(c.value, versioned, /*copied=*/true);
  }
  check_exportable(self);
  return export_capsule(t, versioned);
}

// The Tensor type is written against CPython directly, not as a pybind11
// class: making and freeing one is on every import's path, and pybind11's
// instance registry, holder and type lookups cost more than the rest of a
// view's import. Its methods are pybind11 functions that take `self` as a
// handle and check it (tensor_of).
struct tensor_instance {
  PyObject ob_base;    // PyObject_HEAD
  PyObject* weakrefs;  // weakref.ref(tensor) works, as it did for the pybind11 class
  bool engaged;        // false for Tensor.__new__(Tensor): holds no tensor
  alignas(py_tensor) unsigned char storage[sizeof(py_tensor)];

  py_tensor* get() noexcept { return std::launder(reinterpret_cast<py_tensor*>(storage)); }
};

PyTypeObject* tensor_type = nullptr;

void tensor_dealloc(PyObject* self) {
  auto* o = reinterpret_cast<tensor_instance*>(self);
  PyTypeObject* type = Py_TYPE(self);
  {
    // A Tensor may go while an exception is being raised (a temporary in a
    // failing expression); the producer's deleter, which may run Python
    // code, must neither see it nor lose it.
    const py::error_scope kept;
    if (o->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
    if (o->engaged) {
      o->engaged = false;
      o->get()->~py_tensor();  // the view's producer or the copy's buffer goes here
    }
  }
  type->tp_free(self);
  Py_DECREF(type);
}

int tensor_init(PyObject* /*self*/, PyObject* /*args*/, PyObject* /*kwargs*/) {
  PyErr_SetString(PyExc_TypeError,
                  "dlasync.Tensor has no constructor: tensors come from imports "
                  "(Runtime.from_dlpack, Runtime.import_dlpack)");
  return -1;
}

}  // namespace

bool is_tensor(py::handle obj) noexcept {
  return PyObject_TypeCheck(obj.ptr(), tensor_type) != 0;
}

const py_tensor& tensor_of(py::handle obj) {
  if (!is_tensor(obj)) {
    throw py::type_error(
        absl::StrCat("expected a dlasync.Tensor, not ",
                     std::string(py::str(py::type::handle_of(obj).attr("__name__")))));
  }
  auto* o = reinterpret_cast<tensor_instance*>(obj.ptr());
  if (!o->engaged) {
    // Tensor.__new__ without dlasync behind it: there is no tensor to read.
    throw py::type_error(
        "this dlasync.Tensor holds no tensor (made with Tensor.__new__, not by an import)");
  }
  return *o->get();
}

py::object make_tensor(py_tensor&& t) {
  PyObject* self = tensor_type->tp_alloc(tensor_type, 0);
  if (self == nullptr) throw py::error_already_set();
  auto* o = reinterpret_cast<tensor_instance*>(self);
  new (o->storage) py_tensor(std::move(t));
  o->engaged = true;
  return py::reinterpret_steal<py::object>(self);
}

void check_exportable(const py_tensor& self) {
  const tensor& t = self.value;
  const device own = t.device();
  if (has_negative_stride(t)) {
    throw py::buffer_error(absl::StrCat(
        "this ", own.name(), " tensor has negative strides (", strides_text(t),
        "); dlasync does not export them: PyTorch aborts the process on them rather than "
        "raising. Import it with require_writable=True or require_contiguous=True for a "
        "compact copy, or export it with __dlpack__(copy=True)"));
  }
  if (is_simulated(self)) {
    throw py::buffer_error(absl::StrCat(
        own.name(),
        " is a simulated GPU of this dlasync runtime: its memory is host memory "
        "standing in for device memory, which no other library can read as a GPU's. Bring it "
        "to the host first: rt.from_dlpack(t, device=\"cpu\"), or __dlpack__(dl_device=(1, 0))"));
  }
}

namespace {

std::string repr(const py_tensor& self) {
  const tensor& t = self.value;
  std::string shape;
  for (std::int64_t e : t.shape()) absl::StrAppend(&shape, shape.empty() ? "" : ", ", e);
  if (t.ndim() == 1) shape += ",";
  return absl::StrCat("dlasync.Tensor(shape=(", shape, "), dtype=", t.dtype().name(),
                      ", device=", t.device().name(), t.is_view() ? ", view" : ", copy",
                      t.read_only() ? ", read-only" : "", ")");
}

}  // namespace

void bind_device(py::module_& m) {
  py::class_<py_device>(m, "Device", R"(A device: a DLPack device type and an ordinal.

Device("cuda:1"), Device("cpu"), Device((2, 1)). str() gives "cuda:1"; it
compares equal to the same device given as a string or a tuple.)")
      .def(py::init([](py::handle d) { return py_device{parse_device(d)}; }), py::arg("device"))
      .def(py::init([](py::handle type, py::handle id) {
             return py_device{parse_device(py::make_tuple(type, id))};
           }),
           py::arg("type"), py::arg("id"))
      .def_property_readonly("type",
                             [](const py_device& d) { return static_cast<int>(d.value.kind); })
      .def_property_readonly("id", [](const py_device& d) { return d.value.ordinal; })
      .def_property_readonly(
          "kind", [](const py_device& d) { return std::string(device_kind_name(d.value.kind)); })
      .def("__str__", [](const py_device& d) { return d.value.name(); })
      .def(
          "__repr__",
          [](const py_device& d) { return absl::StrCat("dlasync.Device('", d.value.name(), "')"); })
      .def("__eq__",
           [](const py_device& d, py::handle other) {
             try {
               return parse_device(other) == d.value;
             } catch (py::error_already_set&) {
               return false;
             } catch (py::builtin_exception&) {
               return false;
             }
           })
      .def("__hash__", [](const py_device& d) {
        return py::hash(py::make_tuple(static_cast<int>(d.value.kind), d.value.ordinal));
      });
}

namespace {

// A read-only property of Tensor: `get` reads the tensor of a checked self.
template <class Get>
void add_property(py::handle type, const char* name, Get get, const char* doc = nullptr) {
  // Held for the process, as the type is.
  static const auto* property = new py::object(py::module_::import("builtins").attr("property"));
  py::cpp_function getter([get](py::handle self) { return get(tensor_of(self)); });
  py::setattr(type, name,
              (*property)(getter, py::none(), py::none(),
                          doc != nullptr ? py::object(py::str(doc)) : py::object(py::none())));
}

constexpr const char* kTensorDoc = R"(A tensor imported by dlasync.

A view shares the producer's memory and keeps the producer's tensor until
the last reference (this object, or a tensor exported from it) goes; a copy
owns its memory. Implements the DLPack protocol (__dlpack__,
__dlpack_device__), so NumPy, PyTorch, CuPy and JAX can take it.)";

}  // namespace

void bind_tensor(py::module_& m) {
  static PyMemberDef members[] = {
      {"__weaklistoffset__", T_PYSSIZET,
       static_cast<Py_ssize_t>(offsetof(tensor_instance, weakrefs)), READONLY, nullptr},
      {nullptr, 0, 0, 0, nullptr},
  };
  static PyType_Slot slots[] = {
      {Py_tp_dealloc, reinterpret_cast<void*>(&tensor_dealloc)},
      {Py_tp_new, reinterpret_cast<void*>(&PyType_GenericNew)},
      {Py_tp_init, reinterpret_cast<void*>(&tensor_init)},
      {Py_tp_members, members},
      {Py_tp_doc, const_cast<char*>(kTensorDoc)},
      {0, nullptr},
  };
  static PyType_Spec spec = {"dlasync._core.Tensor", sizeof(tensor_instance), 0, Py_TPFLAGS_DEFAULT,
                             slots};
  auto type = py::reinterpret_steal<py::object>(PyType_FromSpec(&spec));
  if (!type) throw py::error_already_set();
  // Held for the process: imports make Tensors even if the module's
  // attributes are deleted.
  tensor_type = reinterpret_cast<PyTypeObject*>(type.inc_ref().ptr());
  add_property(type, "shape", [](const py_tensor& t) { return as_tuple(t.value.shape()); });
  add_property(
      type, "strides", [](const py_tensor& t) { return as_tuple(t.value.strides()); },
      "Strides in elements, as DLPack counts them (NumPy counts bytes).");
  add_property(type, "ndim", [](const py_tensor& t) { return t.value.ndim(); });
  add_property(type, "size", [](const py_tensor& t) { return t.value.element_count(); });
  add_property(type, "nbytes", [](const py_tensor& t) { return t.value.byte_size(); });
  add_property(
      type, "dtype", [](const py_tensor& t) { return t.value.dtype().name(); },
      "NumPy's name where NumPy has the type (\"float32\", \"bool\"), else DLPack's "
      "(\"bfloat16\", \"float8_e4m3fn\").");
  add_property(type, "device", [](const py_tensor& t) { return py_device{t.value.device()}; });
  add_property(type, "is_view", [](const py_tensor& t) { return t.value.is_view(); });
  add_property(type, "is_copy", [](const py_tensor& t) { return t.value.is_copy(); });
  add_property(type, "read_only", [](const py_tensor& t) { return t.value.read_only(); });
  add_property(type, "is_contiguous", [](const py_tensor& t) { return t.value.is_compact(); });
  add_property(
      type, "data_ptr",
      [](const py_tensor& t) { return reinterpret_cast<std::uintptr_t>(t.value.data()); },
      "The first element's address.");
  add_property(
      type, "stream", [](const py_tensor& t) { return t.value.stream(); },
      "The stream a GPU copy is freed on (DLPack encoding), -1 for views and host copies.");
  py::setattr(type, "__dlpack__",
              py::cpp_function(
                  [](py::handle self, const py::object& stream, const py::object& max_version,
                     const py::object& dl_device, const py::object& copy) {
                    return dlpack(tensor_of(self), stream, max_version, dl_device, copy);
                  },
                  py::name("__dlpack__"), py::is_method(type), py::kw_only(),
                  py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
                  py::arg("dl_device") = py::none(), py::arg("copy") = py::none()));
  py::setattr(type, "__dlpack_device__",
              py::cpp_function(
                  [](py::handle self) {
                    const device d = tensor_of(self).value.device();
                    return py::make_tuple(static_cast<int>(d.kind), d.ordinal);
                  },
                  py::name("__dlpack_device__"), py::is_method(type)));
  py::setattr(type, "__repr__",
              py::cpp_function([](py::handle self) { return repr(tensor_of(self)); },
                               py::name("__repr__"), py::is_method(type)));
  // DLPack 1.3's C exchange API, on the type, where consumers look.
  py::setattr(type, kExchangeApiAttr, exchange_api_capsule());
  m.attr("Tensor") = type;
}

}  // namespace dlasync::python
