// python/src/py_exchange_api.hpp
//
// Finding a producer type's DLPack 1.3 C exchange API, and deciding whether
// to trust it.
//
// A producer type offers the API as its attribute
// `__dlpack_c_exchange_api__`: dlpack.h asks for a PyCapsule named
// "dlpack_exchange_api" holding a pointer to a `DLPackExchangeAPI` that lives
// for the whole process; some producers give the table's address as an int
// instead. Neither form can be proven to point at
// a table: a capsule's pointer and an int are taken as the producer's promise.
// What can be refused is refused before anything is read or called: another
// type, a capsule of another name, a NULL address, an address inside the first
// page (a NULL pointer plus an offset), one not aligned for the table; then,
// reading only the headers, a version that no exchange API has (major 0, or
// 1 before 1.3), a `prev_api` chain that does not go to older major versions
// or runs past 16 tables, and a version-1 table without the two functions
// dlasync calls. A refusal is a TypeError (the attribute's type or capsule
// name) or a ValueError (its values) that names what was seen; it is
// remembered for the type, as a usable table is.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "dlasync/dlpack.hpp"

namespace dlasync::python {

// dlpack.h's DLPackExchangeAPIHeader and DLPackExchangeAPI, declared here
// because the dlpack.h found at build time may predate them.
struct exchange_api_header {
  DLPackVersion version;
  exchange_api_header* prev_api;
};
struct exchange_api {
  exchange_api_header header;
  int (*managed_tensor_allocator)(DLTensor* prototype, DLManagedTensorVersioned** out,
                                  void* error_ctx,
                                  void (*set_error)(void* error_ctx, const char* kind,
                                                    const char* message));
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, DLManagedTensorVersioned** out);
  int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned* tensor,
                                             void** out_py_object);
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out);
  int (*current_work_stream)(DLDeviceType device_type, std::int32_t device_id,
                             void** out_current_stream);
};
static_assert(sizeof(exchange_api) == 56, "DLPackExchangeAPI is 56 bytes on 64-bit targets");

// The attribute names: DLPack 1.3's, and the one Paddle and tvm-ffi 0.1.0 to
// 0.1.3 used before it (an int there).
inline constexpr const char* kExchangeApiAttr = "__dlpack_c_exchange_api__";
inline constexpr const char* kOldExchangeApiAttr = "__c_dlpack_exchange_api__";

// The exchange API of `obj`'s type when it offers one dlasync can use (a
// major-version-1 table, found directly or through prev_api), nullptr when
// it offers none (no attribute, None, or only newer major versions: the
// protocol's `__dlpack__` then). The type's `__dlpack_c_exchange_api__` is
// read, else its older `__c_dlpack_exchange_api__`. Raises TypeError or
// ValueError for an attribute refused as above. Looked up once a type.
const exchange_api* exchange_api_of(pybind11::handle obj);

}  // namespace dlasync::python
