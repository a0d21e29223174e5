#include "py_exchange_export.hpp"

#include <Python.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "dlasync/device_buffer.hpp"
#include "dlasync/dtype.hpp"
#include "dlasync/limits.hpp"
#include "py_errors.hpp"
#include "py_runtime.hpp"
#include "py_source.hpp"
#include "py_tensor.hpp"

namespace py = pybind11;

namespace dlasync::python {
namespace {

// Runs `body` (which sets its results): 0, or -1 with an exception set.
template <typename Body>
int raising(Body&& body) noexcept {
  return python_errors_of(std::forward<Body>(body)) ? 0 : -1;
}

// The dlasync.Tensor `py_object` is, ready to export; TypeError for another
// object, BufferError as __dlpack__ refuses.
const py_tensor& exportable(void* py_object, const char* function) {
  py::handle obj(static_cast<PyObject*>(py_object));
  if (obj.ptr() == nullptr || !is_tensor(obj)) {
    throw py::type_error(absl::StrCat(
        "dlasync's ", function, " takes a dlasync.Tensor, not ",
        obj.ptr() == nullptr ? std::string("NULL")
                             : std::string(py::str(py::type::handle_of(obj).attr("__name__"))),
        ": call the exchange API of the object's own type"));
  }
  const py_tensor& self = tensor_of(obj);
  check_exportable(self);
  return self;
}

int managed_from_py(void* py_object, DLManagedTensorVersioned** out) noexcept {
  if (out != nullptr) *out = nullptr;
  return raising([&] {
    if (out == nullptr) throw py::value_error("managed_tensor_from_py_object_no_sync: out is NULL");
    const py_tensor& self = exportable(py_object, "managed_tensor_from_py_object_no_sync");
    absl::StatusOr<DLManagedTensorVersioned*> exported = self.value.to_dlpack_versioned();
    if (!exported.ok()) throw py::buffer_error(std::string(exported.status().message()));
    *out = *exported;
  });
}

int dltensor_from_py(void* py_object, DLTensor* out) noexcept {
  return raising([&] {
    if (out == nullptr) throw py::value_error("dltensor_from_py_object_no_sync: out is NULL");
    const py_tensor& self = exportable(py_object, "dltensor_from_py_object_no_sync");
    const tensor& t = self.value;
    if (t.read_only()) {
      throw py::buffer_error(
          absl::StrCat("this ", t.device().name(),
                       " tensor is read-only, which a bare DLTensor cannot say: take it with "
                       "managed_tensor_from_py_object_no_sync (READ_ONLY set), or import it with "
                       "require_writable=True for a writable copy"));
    }
    out->data = t.dl_data();
    out->device = DLDevice{static_cast<DLDeviceType>(t.device().kind), t.device().ordinal};
    out->ndim = t.ndim();
    out->dtype = t.dtype().to_dl();
    // The Tensor's own arrays, alive as long as it is; DLTensor's are not const.
    out->shape = const_cast<std::int64_t*>(t.shape().data());
    out->strides = const_cast<std::int64_t*>(t.strides().data());
    out->byte_offset = t.byte_offset();
  });
}

int managed_to_py(DLManagedTensorVersioned* tensor, void** out_py_object) noexcept {
  if (out_py_object != nullptr) *out_py_object = nullptr;
  if (tensor == nullptr || out_py_object == nullptr) {
    PyErr_SetString(PyExc_ValueError,
                    "dlasync's managed_tensor_to_py_object_no_sync was given a NULL tensor or "
                    "out_py_object (a NULL out leaves the tensor to its owner)");
    return -1;
  }
  // Owned by the capsule from here: a refusal gives it to its deleter.
  return raising([&] {
    py::capsule capsule = versioned_capsule(tensor);
    // A view of the caller's memory, as the function promises: a tensor that
    // needs a copy is refused (ValueError), and goes to its deleter.
    py::object t =
        py::module_::import("dlasync").attr("from_dlpack")(capsule, py::arg("copy") = false);
    *out_py_object = t.release().ptr();
  });
}

int current_stream(DLDeviceType /*device_type*/, std::int32_t /*device_id*/,
                   void** out_current_stream) noexcept {
  if (out_current_stream != nullptr) *out_current_stream = nullptr;
  return 0;
}

// Memory from the default runtime for a compact tensor of `prototype`'s
// dtype and shape; its deleter frees it, on any thread, without the GIL.
struct allocation {
  DLManagedTensorVersioned managed{};
  device_buffer buffer;
  std::int64_t dims[2 * max_ndim] = {};
};

void delete_allocation(DLManagedTensorVersioned* self) {
  delete static_cast<allocation*>(self->manager_ctx);
}

// Checks the prototype and writes its shape, then its compact strides, into
// `dims` (2 * ndim entries); its byte size, or the reason it is refused
// (ValueError).
absl::StatusOr<std::uint64_t> compact_layout(const DLTensor& p, std::int64_t* dims) {
  if (p.ndim < 0 || p.ndim > max_ndim) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prototype's ndim is ", p.ndim, "; dlasync allocates 0 to ", max_ndim));
  }
  if (p.ndim > 0 && p.shape == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prototype has ndim ", p.ndim, " and a NULL shape"));
  }
  const dtype type = dtype::from_dl(p.dtype);
  if (type.bits == 0 || type.lanes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the prototype's dtype has bits ", type.bits,
                                                   " and lanes ", type.lanes,
                                                   "; both must be at least 1"));
  }
  std::uint64_t elements = 1;
  for (std::int32_t d = 0; d < p.ndim; ++d) {
    if (p.shape[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the prototype's shape[", d, "] is ", p.shape[d], "; extents are >= 0"));
    }
    if (__builtin_mul_overflow(elements, static_cast<std::uint64_t>(p.shape[d]), &elements)) {
      return absl::InvalidArgumentError("the prototype's element count overflows 64 bits");
    }
    dims[d] = p.shape[d];
  }
  // The compact strides, which a zero extent leaves unbounded by the count.
  std::int64_t stride = 1;
  for (std::int32_t d = p.ndim - 1; d >= 0; --d) {
    dims[p.ndim + d] = stride;
    if (d > 0 && __builtin_mul_overflow(stride, p.shape[d] > 0 ? p.shape[d] : 1, &stride)) {
      return absl::InvalidArgumentError(
          "the prototype's strides overflow 64 bits (its extents multiply past 2^63)");
    }
  }
  std::uint64_t bits = 0;
  if (__builtin_mul_overflow(elements, std::uint64_t{type.bits} * type.lanes, &bits) ||
      bits > std::numeric_limits<std::uint64_t>::max() - 7) {
    return absl::InvalidArgumentError("the prototype's byte size overflows 64 bits");
  }
  return (bits + 7) / 8;
}

int allocate(DLTensor* prototype, DLManagedTensorVersioned** out, void* error_ctx,
             void (*set_error)(void* error_ctx, const char* kind, const char* message)) noexcept {
  if (out != nullptr) *out = nullptr;
  // What SetError reports; fixed buffers, so that reporting cannot throw.
  std::array<char, 64> kind{"RuntimeError"};
  std::array<char, 1024> message{"dlasync's managed_tensor_allocator failed"};
  try {
    py::gil_scoped_acquire gil;
    const int rc = raising([&] {
      if (prototype == nullptr || out == nullptr) {
        throw py::value_error("managed_tensor_allocator was given a NULL prototype or out");
      }
      auto a = std::make_unique<allocation>();
      absl::StatusOr<std::uint64_t> bytes = compact_layout(*prototype, a->dims);
      if (!bytes.ok()) throw py::value_error(std::string(bytes.status().message()));
      const device d{static_cast<device_kind>(prototype->device.device_type),
                     prototype->device.device_id};
      py::object owner = py::module_::import("dlasync").attr("_default_runtime")();
      runtime& rt = owner.cast<py_runtime&>().get();
      if (rt.is_simulated(d)) {
        throw py::buffer_error(absl::StrCat(
            d.name(),
            " is a simulated GPU of dlasync's default runtime: its memory is host "
            "memory standing in for device memory, which the caller cannot use as a GPU's"));
      }
      {
        py::gil_scoped_release unlocked;
        absl::StatusOr<device_buffer> buffer = rt.allocate(d, *bytes);
        if (!buffer.ok()) {
          py::gil_scoped_acquire again;
          const absl::StatusCode code = buffer.status().code();
          // A device no backend here serves or allocates: the prototype is wrong.
          if (code == absl::StatusCode::kNotFound ||
              code == absl::StatusCode::kFailedPrecondition ||
              code == absl::StatusCode::kUnimplemented ||
              code == absl::StatusCode::kInvalidArgument) {
            throw py::value_error(std::string(buffer.status().message()));
          }
          raise_status(buffer.status());  // MemoryError when memory ran out
        }
        a->buffer = std::move(*buffer);
      }
      DLManagedTensorVersioned& m = a->managed;
      m.version = DLPackVersion{dlpack_major_version, dlpack_minor_version};
      m.manager_ctx = a.get();
      m.deleter = &delete_allocation;
      m.dl_tensor.data = a->buffer.data();
      m.dl_tensor.device = prototype->device;
      m.dl_tensor.ndim = prototype->ndim;
      m.dl_tensor.dtype = prototype->dtype;
      const std::int32_t n = prototype->ndim;
      m.dl_tensor.shape = n > 0 ? a->dims : nullptr;
      m.dl_tensor.strides = n > 0 ? a->dims + n : nullptr;
      *out = &a.release()->managed;
    });
    if (rc == 0) return 0;
    // SetError reports it; the caller's error indicator is left as it was.
    py::error_already_set e;
    std::snprintf(kind.data(), kind.size(), "%s",
                  std::string(py::str(e.type().attr("__name__"))).c_str());
    std::snprintf(message.data(), message.size(), "%s", std::string(py::str(e.value())).c_str());
  } catch (...) {
    // The error could not be read (or the GIL not taken): the defaults stand.
    if (PyGILState_Check() != 0) PyErr_Clear();
  }
  if (set_error != nullptr) {
    set_error(error_ctx, kind.data(), message.data());
  } else {
    const PyGILState_STATE state = PyGILState_Ensure();
    PyErr_SetString(PyExc_RuntimeError, message.data());
    PyGILState_Release(state);
  }
  return -1;
}

constexpr exchange_api make_table() {
  exchange_api t{};
  t.header.version = DLPackVersion{1, 3};
  t.header.prev_api = nullptr;
  t.managed_tensor_allocator = &allocate;
  t.managed_tensor_from_py_object_no_sync = &managed_from_py;
  t.managed_tensor_to_py_object_no_sync = &managed_to_py;
  t.dltensor_from_py_object_no_sync = &dltensor_from_py;
  t.current_work_stream = &current_stream;
  return t;
}

// Lives for the process, as DLPack asks.
constinit exchange_api table = make_table();

}  // namespace

const exchange_api* tensor_exchange_api() noexcept {
  return &table;
}

py::capsule exchange_api_capsule() {
  return py::capsule(static_cast<void*>(&table), "dlpack_exchange_api");
}

}  // namespace dlasync::python
