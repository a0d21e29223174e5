#include "py_source.hpp"

#include <Python.h>

#include <climits>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "py_errors.hpp"
#include "py_release.hpp"
#include "py_tensor.hpp"

namespace py = pybind11;

namespace dlasync::python {
namespace {

constexpr const char* kLegacy = "dltensor";
constexpr const char* kVersioned = "dltensor_versioned";
constexpr const char* kUsedLegacy = "used_dltensor";
constexpr const char* kUsedVersioned = "used_dltensor_versioned";

// The producer's tensor, behind a managed tensor of dlasync's whose deleter
// hands the producer's deleter to release_with_gil.
struct held_producer {
  released_tensor inner;
  DLManagedTensorVersioned versioned{};
  DLManagedTensor legacy{};
};

void call_inner_deleter(held_producer* h) noexcept {
  if (h->inner.versioned != nullptr && h->inner.versioned->deleter != nullptr) {
    h->inner.versioned->deleter(h->inner.versioned);
  } else if (h->inner.legacy != nullptr && h->inner.legacy->deleter != nullptr) {
    h->inner.legacy->deleter(h->inner.legacy);
  }
}

void drop_held(held_producer* h) {
  release_with_gil([h] {
    call_inner_deleter(h);
    delete h;
  });
}

void held_versioned_deleter(DLManagedTensorVersioned* t) {
  drop_held(static_cast<held_producer*>(t->manager_ctx));
}
void held_legacy_deleter(DLManagedTensor* t) {
  drop_held(static_cast<held_producer*>(t->manager_ctx));
}

managed_tensor wrap(released_tensor inner) {
  auto* h = new held_producer{inner, {}, {}};
  if (inner.versioned != nullptr) {
    h->versioned.version = inner.versioned->version;
    h->versioned.manager_ctx = h;
    h->versioned.deleter = &held_versioned_deleter;
    // Beyond the version, a tensor of a newer major version may be laid out
    // otherwise: nothing more is read, and validation refuses it by version.
    if (inner.versioned->version.major <= dlpack_major_version) {
      h->versioned.flags = inner.versioned->flags;
      h->versioned.dl_tensor = inner.versioned->dl_tensor;
    }
    return managed_tensor(&h->versioned);
  }
  h->legacy.dl_tensor = inner.legacy->dl_tensor;
  h->legacy.manager_ctx = h;
  h->legacy.deleter = &held_legacy_deleter;
  return managed_tensor(&h->legacy);
}

// Claims `capsule`'s tensor. Nothing here gives up the GIL or calls into
// Python between the name check and the rename: that stretch is what makes
// the claim atomic, process-wide.
taken_source from_capsule(py::object capsule, batch_members* batch) {
  if (batch != nullptr) batch->check_capsule(capsule.ptr());
  const char* name = PyCapsule_GetName(capsule.ptr());
  if (name == nullptr) {
    if (PyErr_Occurred() != nullptr) throw py::error_already_set();
    throw py::type_error(
        absl::StrCat("a capsule with no name (NULL) is not a DLPack tensor; "
                     "DLPack names its capsules \"",
                     kLegacy, "\" or \"", kVersioned, "\""));
  }
  const bool versioned = std::strcmp(name, kVersioned) == 0;
  if (!versioned && std::strcmp(name, kLegacy) != 0) {
    const bool used = std::strcmp(name, kUsedLegacy) == 0 || std::strcmp(name, kUsedVersioned) == 0;
    if (used) {
      throw py::buffer_error(absl::StrCat(
          "the DLPack capsule was consumed already, or is being imported (its name is \"", name,
          "\"): a DLPack tensor can be imported once; ask the producer for a new one with "
          "__dlpack__()"));
    }
    throw py::type_error(absl::StrCat("a capsule named \"", name,
                                      "\" is not a DLPack tensor; expected \"", kLegacy, "\" or \"",
                                      kVersioned, "\""));
  }
  // Never NULL for a capsule of that name: PyCapsule_New refuses NULL.
  void* ptr = PyCapsule_GetPointer(capsule.ptr(), name);
  if (ptr == nullptr) throw py::error_already_set();
  if (batch != nullptr) batch->check_tensor(ptr, "capsule");
  released_tensor inner;
  if (versioned) {
    inner.versioned = static_cast<DLManagedTensorVersioned*>(ptr);
  } else {
    inner.legacy = static_cast<DLManagedTensor*>(ptr);
  }
  taken_source out;
  out.source = wrap(inner);
  out.capsule = std::move(capsule);
  // The producer's name may not outlive the claim; DLPack's equal literal does.
  out.capsule_name = versioned ? kVersioned : kLegacy;
  if (PyCapsule_SetName(out.capsule.ptr(), versioned ? kUsedVersioned : kUsedLegacy) != 0) {
    throw py::error_already_set();
  }
  if (batch != nullptr) batch->add(out.capsule.ptr(), ptr);
  return out;
}

// The names and constants of the per-call path, made once (the GIL held),
// alive for the process.
struct call_names {
  PyObject* dlpack = PyUnicode_InternFromString("__dlpack__");
  PyObject* dlpack_device = PyUnicode_InternFromString("__dlpack_device__");
  PyObject* numpy = PyUnicode_InternFromString("numpy");
  PyObject* max_version = Py_BuildValue("(II)", dlpack_major_version, dlpack_minor_version);
  // Keyword names interned, as the producer's own are: argument parsers
  // (NumPy's, CPython's) match them by identity before comparing text.
  PyObject* kw_max_version = Py_BuildValue("(N)", PyUnicode_InternFromString("max_version"));
  PyObject* kw_stream = Py_BuildValue("(N)", PyUnicode_InternFromString("stream"));
  PyObject* kw_stream_max_version = Py_BuildValue("(NN)", PyUnicode_InternFromString("stream"),
                                                  PyUnicode_InternFromString("max_version"));
};

const call_names& names() {
  static const auto* n = new call_names();
  return *n;
}

// Whether `obj` has a `__dlpack__` to call (not missing, not None): asked
// only after a call failed, to tell the two apart. The call's exception is
// kept when it has one.
bool has_dlpack(py::handle obj) {
  const py::error_scope kept;
  PyObject* method = PyObject_GetAttr(obj.ptr(), names().dlpack);
  // Only a missing attribute, or None, means no __dlpack__: a getter that
  // raised something else keeps the call's own error.
  const bool missing =
      method == nullptr ? PyErr_ExceptionMatches(PyExc_AttributeError) != 0 : method == Py_None;
  Py_XDECREF(method);
  PyErr_Clear();
  return !missing;
}

[[noreturn]] void refuse_no_dlpack(py::handle obj) {
  PyErr_Clear();
  throw py::attribute_error(
      absl::StrCat("dlasync imports objects that implement the DLPack protocol (__dlpack__ and "
                   "__dlpack_device__) or DLPack capsules; a ",
                   std::string(py::str(py::type::handle_of(obj).attr("__name__"))),
                   " has no __dlpack__: convert it with numpy.asarray or torch.as_tensor first"));
}

bool is_keyword_refusal(const py::error_already_set& e) {
  if (!e.matches(PyExc_TypeError)) return false;
  const std::string what = py::str(e.value());
  return what.find("max_version") != std::string::npos || what.find("keyword") != std::string::npos;
}

// The producer types that refused max_version once: asked the legacy way
// from then on, without raising and catching a TypeError per import.
// (The set keeps those types alive: a handful, for the process's life.)
py::set& legacy_producer_types() {
  static auto* types = new py::set();
  return *types;
}

void capsule_destructor(PyObject* capsule) {
  // A capsule may go while an exception is being raised: that exception is
  // kept, whatever the deleter does.
  const py::error_scope kept;
  if (PyCapsule_IsValid(capsule, kVersioned) != 0) {
    auto* t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, kVersioned));
    if (t->deleter != nullptr) t->deleter(t);
  } else if (PyCapsule_IsValid(capsule, kLegacy) != 0) {
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kLegacy));
    if (t->deleter != nullptr) t->deleter(t);
  }
  // Renamed by a consumer: the consumer owns it now. (The name checks set
  // no error that outlives this.)
  PyErr_Clear();
}

// A function of a producer's exchange API failed: what it raised, or a
// BufferError when it raised nothing (as DLPack asks it to).
// `outcome` says what became of the tensor.
[[noreturn]] void raise_producer_error(py::handle obj, const char* function, int rc,
                                       const char* outcome) {
  if (PyErr_Occurred() != nullptr) throw py::error_already_set();
  throw py::buffer_error(
      absl::StrCat("the DLPack exchange API of ",
                   std::string(py::str(py::type::handle_of(obj).attr("__name__"))), ": ", function,
                   " returned ", rc,
                   " and set no Python error (a producer must set one when it "
                   "fails); ",
                   outcome));
}

}  // namespace

void batch_members::check_capsule(PyObject* capsule) const {
  if (const auto it = capsules_.find(capsule); it != capsules_.end()) {
    throw py::buffer_error(absl::StrCat(
        "batch member ", position_, " is the DLPack capsule of member ", it->second,
        " again: a capsule can be imported once; put each tensor in a batch once, and give "
        "each member a capsule of its own (a __dlpack__ must return a new capsule each call)"));
  }
}

void batch_members::check_tensor(const void* tensor, const char* source) const {
  if (const auto it = tensors_.find(tensor); it != tensors_.end()) {
    throw py::buffer_error(absl::StrCat(
        "batch member ", position_, "'s ", source, " holds the DLPack tensor of member ",
        it->second, " (DLManagedTensor at 0x", absl::Hex(reinterpret_cast<std::uintptr_t>(tensor)),
        ") again: the producer handed one tensor out twice, and a tensor can be owned once; "
        "import it once"));
  }
}

void batch_members::add(PyObject* capsule, const void* tensor) {
  if (capsule != nullptr) capsules_.emplace(capsule, position_);
  tensors_.emplace(tensor, position_);
}

taken_source::~taken_source() {
  // Not settled (an exception between take and start): the capsule keeps it.
  if (!source.empty()) settle();
}

void taken_source::settle() {
  // Consumed: the capsule was renamed when it was taken.
  if (source.empty()) return;
  if (!capsule || capsule.is_none())
    return;  // dlasync's own export: its deleter just drops a reference
  released_tensor r = source.release();
  void* ctx = r.versioned != nullptr ? r.versioned->manager_ctx : r.legacy->manager_ctx;
  delete static_cast<held_producer*>(ctx);
  // Refused: the producer's tensor goes back to its capsule, which deletes
  // it when it goes.
  if (PyCapsule_SetName(capsule.ptr(), capsule_name) != 0) PyErr_Clear();
}

bool is_numpy_array(py::handle obj) noexcept {
  // The type is learnt from the first array seen, by name, and confirmed
  // against the numpy module's own: a type merely named so is not taken.
  static PyTypeObject* ndarray = nullptr;
  PyTypeObject* type = Py_TYPE(obj.ptr());
  if (type == ndarray) return true;
  if (ndarray != nullptr || std::strcmp(type->tp_name, "numpy.ndarray") != 0) return false;
  PyObject* numpy = PyImport_GetModule(names().numpy);  // new reference, or NULL
  if (numpy == nullptr) {
    PyErr_Clear();
    return false;
  }
  PyObject* real = PyObject_GetAttrString(numpy, "ndarray");
  Py_DECREF(numpy);
  if (real == nullptr) {
    PyErr_Clear();
    return false;
  }
  // The module keeps its type alive as long as the interpreter runs.
  if (real == reinterpret_cast<PyObject*>(type)) ndarray = type;
  Py_DECREF(real);
  return ndarray == type;
}

std::optional<std::pair<int, int>> dlpack_device_of(py::handle obj) {
  PyObject* method = PyObject_GetAttr(obj.ptr(), names().dlpack_device);
  if (method == nullptr) {
    if (PyErr_ExceptionMatches(PyExc_AttributeError) == 0) throw py::error_already_set();
    PyErr_Clear();
    return std::nullopt;
  }
  auto d = py::reinterpret_steal<py::object>(PyObject_CallNoArgs(method));
  Py_DECREF(method);
  if (!d) throw py::error_already_set();
  // The usual answer, a tuple of two small ints, read without pybind11's casts.
  if (PyTuple_CheckExact(d.ptr()) != 0 && PyTuple_GET_SIZE(d.ptr()) == 2) {
    PyObject* type = PyTuple_GET_ITEM(d.ptr(), 0);
    PyObject* id = PyTuple_GET_ITEM(d.ptr(), 1);
    if (PyLong_CheckExact(type) != 0 && PyLong_CheckExact(id) != 0) {
      int overflow = 0;
      const long t = PyLong_AsLongAndOverflow(type, &overflow);
      const long i = overflow == 0 ? PyLong_AsLongAndOverflow(id, &overflow) : 0;
      if (overflow == 0 && t >= INT_MIN && t <= INT_MAX && i >= INT_MIN && i <= INT_MAX) {
        return std::pair<int, int>(static_cast<int>(t), static_cast<int>(i));
      }
    }
  }
  try {
    return d.cast<std::pair<int, int>>();
  } catch (const py::cast_error&) {
    throw py::type_error(absl::StrCat(
        "__dlpack_device__ of a ", std::string(py::str(py::type::handle_of(obj).attr("__name__"))),
        " returned ", std::string(py::repr(d)),
        "; the protocol asks for a (device_type, device_id) tuple of ints"));
  }
}

taken_source take_source(py::handle obj, std::optional<std::int64_t> stream, batch_members* batch) {
  if (is_tensor(obj)) {
    const tensor& t = tensor_of(obj).value;
    absl::StatusOr<DLManagedTensorVersioned*> out = t.to_dlpack_versioned();
    if (!out.ok()) raise_status(out.status());
    taken_source s;
    s.source = managed_tensor(*out);
    s.capsule = py::none();
    return s;
  }
  if (PyCapsule_CheckExact(obj.ptr()) != 0) {
    return from_capsule(py::reinterpret_borrow<py::object>(obj), batch);
  }
  // Called as a method with vectorcall and constant keyword names: no bound
  // method and no dict a call.
  py::object stream_value;
  if (stream) stream_value = py::int_(*stream);
  const auto call = [&](bool versioned) {
    PyObject* args[4] = {nullptr, obj.ptr(), nullptr, nullptr};
    std::size_t n = 2;
    PyObject* kwnames = nullptr;
    if (stream) args[n++] = stream_value.ptr();
    if (versioned) args[n++] = names().max_version;
    if (stream && versioned) {
      kwnames = names().kw_stream_max_version;
    } else if (stream) {
      kwnames = names().kw_stream;
    } else if (versioned) {
      kwnames = names().kw_max_version;
    }
    PyObject* out = PyObject_VectorcallMethod(names().dlpack, args + 1,
                                              1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
    if (out == nullptr) {
      if (!has_dlpack(obj)) refuse_no_dlpack(obj);
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(out);
  };
  py::object capsule;
  py::handle type = py::type::handle_of(obj);
  if (legacy_producer_types().contains(type)) {
    capsule = call(false);
  } else {
    try {
      capsule = call(true);
    } catch (py::error_already_set& e) {
      if (!is_keyword_refusal(e)) throw;
      // A producer older than DLPack 1.0's Python protocol: the legacy call.
      capsule = call(false);
      legacy_producer_types().add(type);
    }
  }
  if (PyCapsule_CheckExact(capsule.ptr()) == 0) {
    throw py::type_error(absl::StrCat(
        "__dlpack__ of a ", std::string(py::str(py::type::handle_of(obj).attr("__name__"))),
        " returned a ", std::string(py::str(py::type::handle_of(capsule).attr("__name__"))),
        ", not a DLPack capsule"));
  }
  return from_capsule(std::move(capsule), batch);
}

taken_source take_exchange(py::handle obj, const exchange_api& api, batch_members* batch) {
  DLManagedTensorVersioned* out = nullptr;
  if (const int rc = api.managed_tensor_from_py_object_no_sync(obj.ptr(), &out); rc != 0) {
    raise_producer_error(obj, "managed_tensor_from_py_object_no_sync", rc, "no tensor was taken");
  }
  if (out == nullptr) {
    throw py::buffer_error(
        absl::StrCat("the DLPack exchange API of ",
                     std::string(py::str(py::type::handle_of(obj).attr("__name__"))),
                     " returned no tensor and no error"));
  }
  // A repeat is left to the producer: deleting it would delete the
  // earlier member's tensor.
  if (batch != nullptr) {
    batch->check_tensor(out, "exchange API tensor");
    batch->add(nullptr, out);
  }
  released_tensor inner;
  inner.versioned = out;
  taken_source s;
  s.source = wrap(inner);
  s.capsule = py::none();
  if (out->version.major == dlpack_major_version) {
    const DLDevice dev = out->dl_tensor.device;
    const auto kind = static_cast<device_kind>(dev.device_type);
    if (kind == device_kind::cuda || kind == device_kind::cuda_managed) {
      void* stream = nullptr;
      if (const int rc = api.current_work_stream(dev.device_type, dev.device_id, &stream);
          rc != 0) {
        // `s` gives the tensor back to its deleter.
        raise_producer_error(obj, "current_work_stream", rc,
                             "the tensor went back to the producer's deleter");
      }
      // A null stream is the legacy default stream, which DLPack writes as 1.
      s.producer_stream =
          stream == nullptr ? stream_legacy_default : reinterpret_cast<std::int64_t>(stream);
    }
  }
  return s;
}

py::capsule versioned_capsule(DLManagedTensorVersioned* t) {
  PyObject* c = PyCapsule_New(t, kVersioned, &capsule_destructor);
  if (c == nullptr) {
    if (t->deleter != nullptr) t->deleter(t);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(c);
}

py::capsule export_capsule(const tensor& t, bool versioned, bool copied) {
  if (versioned) {
    absl::StatusOr<DLManagedTensorVersioned*> out = t.to_dlpack_versioned();
    if (!out.ok()) raise_status(out.status());
    if (copied) (*out)->flags |= flag_is_copied;
    return versioned_capsule(*out);
  }
  absl::StatusOr<DLManagedTensor*> out = t.to_dlpack_legacy();
  if (!out.ok()) {
    throw py::buffer_error(absl::StrCat(
        std::string(out.status().message()),
        ". The consumer asked for legacy DLPack (no max_version): pass max_version=(1, 0) or "
        "more, or import with require_writable=True to get a writable copy"));
  }
  PyObject* c = PyCapsule_New(*out, kLegacy, &capsule_destructor);
  if (c == nullptr) {
    (*out)->deleter(*out);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(c);
}

}  // namespace dlasync::python
