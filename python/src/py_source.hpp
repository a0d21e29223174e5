// python/src/py_source.hpp
//
// Taking a DLPack tensor from a Python object for one import, and giving
// one out as a capsule.
//
// take_source() asks the object for its tensor the way the DLPack Python
// protocol says: `__dlpack__(stream=..., max_version=(1, 3))`, falling back
// to the legacy call when the producer refuses the keyword with TypeError
// (NumPy 1.24, PyTorch 1.13). Raw capsules ("dltensor",
// "dltensor_versioned") and dlasync's own tensors are taken as they are.
// The producer's tensor is wrapped so that its deleter runs with the GIL
// (py_release.hpp), never on a worker that would wait for it.
//
// A capsule is claimed when it is taken: in one stretch under the GIL, its
// name is checked, its pointer read and the capsule renamed
// "used_dltensor[_versioned]", as the protocol says, before anything gives
// up the GIL or calls back into Python. So a capsule is taken once in the
// process, whatever threads or nested imports (a producer's __dlpack__ that
// imports) reach it meanwhile: the others find it used. After the import has
// started, settle() finishes the exchange: a refused tensor goes back to its
// capsule, whose name is given back, and the wrapper goes without calling
// the producer's deleter.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "dlasync/dlpack.hpp"
#include "dlasync/tensor.hpp"
#include "py_exchange_api.hpp"

namespace dlasync::python {

struct taken_source {
  managed_tensor source;
  pybind11::object capsule;  // None for dlasync's own tensors and the exchange API
  // The capsule's name before it was claimed, given back when refused.
  const char* capsule_name = nullptr;
  // From the exchange API: the producer's current work stream on its GPU
  // (DLPack encoding), which the import follows.
  std::optional<std::int64_t> producer_stream;

  taken_source() = default;
  taken_source(taken_source&&) noexcept = default;
  taken_source& operator=(taken_source&&) noexcept = default;
  ~taken_source();

  // Call once the import has started (the GIL held).
  void settle();
};

// Whether `obj` is exactly a NumPy ndarray (not a subclass). NumPy's
// `__dlpack__` takes no stream but None, and its arrays are host memory (or
// a host-readable producer's, whose stream NumPy does not know either).
bool is_numpy_array(pybind11::handle obj) noexcept;

// The DLPack device of `obj` from `__dlpack_device__()`, or nullopt when it
// has none (a capsule, or an object that only has `__dlpack__`).
std::optional<std::pair<int, int>> dlpack_device_of(pybind11::handle obj);

// The members a batch has taken so far. A member that repeats one (the
// same capsule, from the caller or from a `__dlpack__` that hands out one
// capsule each call, or the same DLPack tensor from another capsule or the
// exchange API) is refused with BufferError naming both positions, and
// nothing of it is taken: one tensor is never owned twice.
class batch_members {
 public:
  // The position of the member taken next.
  void at(std::size_t position) noexcept { position_ = position; }
  // Raise BufferError when an earlier member took `capsule`, or `tensor`.
  void check_capsule(PyObject* capsule) const;
  void check_tensor(const void* tensor, const char* source) const;
  void add(PyObject* capsule, const void* tensor);

 private:
  std::size_t position_ = 0;
  absl::flat_hash_map<const void*, std::size_t> capsules_;
  absl::flat_hash_map<const void*, std::size_t> tensors_;
};

// Takes `obj`'s tensor; `stream` is passed to `__dlpack__` as the consumer's
// stream (nullopt: none); `batch`, when given, refuses a repeated member.
// Raises AttributeError for an object without `__dlpack__`, TypeError or
// BufferError for a capsule that is not a DLPack tensor or was consumed
// already (or is being imported), and what the producer raises.
taken_source take_source(pybind11::handle obj, std::optional<std::int64_t> stream,
                         batch_members* batch = nullptr);

// Takes `obj`'s tensor through `api`: no Python call, and the producer's
// current work stream for a GPU tensor. A tensor the import refuses is
// given back to the producer's deleter at settle(), as no capsule holds it.
// A tensor `batch` has already (the producer handed one out twice) is
// refused and left to the producer, never deleted twice.
taken_source take_exchange(pybind11::handle obj, const exchange_api& api,
                           batch_members* batch = nullptr);

// A new capsule holding `t` exported as DLPack: versioned
// ("dltensor_versioned") when `versioned`, else legacy ("dltensor"). The
// capsule deletes the tensor unless a consumer renamed it. `copied`: `t` is
// a copy made for this export, which a versioned tensor says with IS_COPIED
// (legacy DLPack has no flags). BufferError when legacy DLPack cannot carry
// it (read-only).
pybind11::capsule export_capsule(const tensor& t, bool versioned, bool copied = false);

// A new capsule ("dltensor_versioned") that owns `t`: it calls t's deleter
// unless a consumer renamed it. When no capsule can be made, t's deleter
// runs and the error is raised.
pybind11::capsule versioned_capsule(DLManagedTensorVersioned* t);

}  // namespace dlasync::python
