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
// After the import has started, settle() finishes the exchange: a consumed
// tensor's capsule is renamed "used_dltensor[_versioned]", as the protocol
// says, so that the capsule no longer deletes it; a refused one is left to
// its capsule, untouched, and the wrapper goes without calling the
// producer's deleter.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>

#include "dlasync/transfer/managed_tensor.hpp"
#include "dlasync/transfer/tensor.hpp"

namespace dlasync::python {

struct taken_source {
  managed_tensor source;
  pybind11::object capsule;  // None for dlasync's own tensors and the exchange API
  const char* used_name = nullptr;
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

// The DLPack device of `obj` from `__dlpack_device__()`, or nullopt when it
// has none (a capsule, or an object that only has `__dlpack__`).
std::optional<std::pair<int, int>> dlpack_device_of(pybind11::handle obj);

// Takes `obj`'s tensor; `stream` is passed to `__dlpack__` as the consumer's
// stream (nullopt: none). Raises AttributeError for an object without
// `__dlpack__`, TypeError or BufferError for a capsule that is not a DLPack
// tensor or was consumed already, and what the producer raises.
taken_source take_source(pybind11::handle obj, std::optional<std::int64_t> stream);

// DLPack 1.3's C exchange API (dlpack.h's DLPackExchangeAPI), declared
// here because the dlpack.h found at build time may predate it. A producer
// type offers it as `__dlpack_c_exchange_api__`, a capsule named
// "dlpack_exchange_api" (or an int holding the pointer); the table lives
// for the whole process.
struct exchange_api_header {
  DLPackVersion version;
  exchange_api_header* prev_api;
};
struct exchange_api {
  exchange_api_header header;
  void* managed_tensor_allocator;
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, DLManagedTensorVersioned** out);
  void* managed_tensor_to_py_object_no_sync;
  void* dltensor_from_py_object_no_sync;
  int (*current_work_stream)(std::int32_t device_type, std::int32_t device_id,
                             void** out_current_stream);
};

// The exchange API of `obj`'s type when it offers one dlasync can use (major
// version 1, found directly or through prev_api), else nullptr. Looked up
// once a type.
const exchange_api* exchange_api_of(pybind11::handle obj);

// Takes `obj`'s tensor through `api`: no Python call, and the producer's
// current work stream for a GPU tensor. A tensor the import refuses is
// given back to the producer's deleter at settle(), as no capsule holds it.
taken_source take_exchange(pybind11::handle obj, const exchange_api& api);

// A new capsule holding `t` exported as DLPack: versioned
// ("dltensor_versioned") when `versioned`, else legacy ("dltensor"). The
// capsule deletes the tensor unless a consumer renamed it. BufferError when
// legacy DLPack cannot carry it (read-only).
pybind11::capsule export_capsule(const tensor& t, bool versioned);

}  // namespace dlasync::python
