/* DLPack 1.3's declarations that the C consumer and the C producer of the
 * Python tests (exchange_consumer.c, exchange_producer.c) are written
 * against: the tensor, the versioned managed tensor and the C exchange API's
 * table. Written out from dlpack.h 1.3 because the dlpack.h a build finds may
 * predate them, and apart from dlasync's own declarations on purpose: a
 * mistake in dlasync's table layout must not be shared by its tests. */
#ifndef DLASYNC_TESTS_PYTHON_DLPACK_EXCHANGE_H
#define DLASYNC_TESTS_PYTHON_DLPACK_EXCHANGE_H

#include <stdint.h>

typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
typedef struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  struct DLPackExchangeAPIHeader* prev_api;
} DLPackExchangeAPIHeader;
typedef struct {
  DLPackExchangeAPIHeader header;
  int (*managed_tensor_allocator)(DLTensor* prototype, DLManagedTensorVersioned** out,
                                  void* error_ctx,
                                  void (*set_error)(void* error_ctx, const char* kind,
                                                    const char* message));
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, DLManagedTensorVersioned** out);
  int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned* tensor,
                                             void** out_py_object);
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out);
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
} DLPackExchangeAPI;

#endif
