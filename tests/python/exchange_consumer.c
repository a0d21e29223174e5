/* A consumer of DLPack 1.3's C exchange API written in C, for the Python
 * tests: it takes tensors through a producer's table the way tvm-ffi and
 * PyTorch's extensions do, with no Python call, and counts what it does.
 * Loaded with ctypes; `api` is the table's address (from the type's
 * __dlpack_c_exchange_api__ capsule), `obj` the PyObject*.
 *
 * DLPack's declarations are in dlpack_exchange.h. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dlpack_exchange.h"

/* What a take saw, for the test to check. */
typedef struct {
  uint32_t major, minor;
  uint64_t flags;
  void* data;
  int32_t device_type, device_id, ndim;
  uint8_t code, bits;
  uint16_t lanes;
  int64_t shape[8], strides[8];
  uint64_t byte_offset;
  double first; /* the first float32 or float64 element, read through data */
} seen;

static void record(const DLTensor* t, seen* s) {
  s->data = t->data;
  s->device_type = t->device.device_type;
  s->device_id = t->device.device_id;
  s->ndim = t->ndim;
  s->code = t->dtype.code;
  s->bits = t->dtype.bits;
  s->lanes = t->dtype.lanes;
  for (int i = 0; i < t->ndim && i < 8; ++i) {
    s->shape[i] = t->shape[i];
    s->strides[i] = t->strides ? t->strides[i] : 0;
  }
  s->byte_offset = t->byte_offset;
  s->first = 0;
  if (t->device.device_type == 1 && t->data != NULL) {
    const char* p = (const char*)t->data + t->byte_offset;
    if (t->dtype.code == 2 && t->dtype.bits == 32) {
      float f;
      memcpy(&f, p, sizeof f);
      s->first = f;
    } else if (t->dtype.code == 2 && t->dtype.bits == 64) {
      memcpy(&s->first, p, sizeof s->first);
    }
  }
}

/* Takes obj's tensor, records it, and keeps it (the caller ends it with
 * release()). Returns what the table function returned. */
int take(const DLPackExchangeAPI* api, void* obj, seen* s, DLManagedTensorVersioned** kept) {
  DLManagedTensorVersioned* t = NULL;
  int rc = api->managed_tensor_from_py_object_no_sync(obj, &t);
  if (rc != 0) return rc;
  s->major = t->version.major;
  s->minor = t->version.minor;
  s->flags = t->flags;
  record(&t->dl_tensor, s);
  *kept = t;
  return 0;
}

void release(DLManagedTensorVersioned* t) {
  if (t->deleter) t->deleter(t);
}

/* The non-owning form. */
int view(const DLPackExchangeAPI* api, void* obj, seen* s) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  int rc = api->dltensor_from_py_object_no_sync(obj, &t);
  if (rc == 0) record(&t, s);
  return rc;
}

int stream_of(const DLPackExchangeAPI* api, int32_t device_type, int32_t device_id,
              void** out) {
  *out = (void*)1; /* overwritten by the table */
  return api->current_work_stream(device_type, device_id, out);
}

/* The allocator; on failure the kind and message SetError reported. */
typedef struct { char kind[64]; char message[512]; int calls; } error_box;

static void set_error(void* ctx, const char* kind, const char* message) {
  error_box* box = (error_box*)ctx;
  snprintf(box->kind, sizeof box->kind, "%s", kind);
  snprintf(box->message, sizeof box->message, "%s", message);
  box->calls++;
}

int allocate(const DLPackExchangeAPI* api, int32_t device_type, int32_t device_id, uint8_t code,
             uint8_t bits, int32_t ndim, int64_t* shape, DLManagedTensorVersioned** out,
             error_box* box) {
  DLTensor prototype;
  memset(&prototype, 0, sizeof prototype);
  prototype.device.device_type = device_type;
  prototype.device.device_id = device_id;
  prototype.ndim = ndim;
  prototype.dtype.code = code;
  prototype.dtype.bits = bits;
  prototype.dtype.lanes = 1;
  prototype.shape = shape;
  return api->managed_tensor_allocator(&prototype, out, box, set_error);
}

/* Hands `t` to the producer's type: the new object, or NULL. */
int to_object(const DLPackExchangeAPI* api, DLManagedTensorVersioned* t, void** out) {
  return api->managed_tensor_to_py_object_no_sync(t, out);
}

/* Nanoseconds a take-and-release of obj's tensor costs, averaged over n. */
double take_release_ns(const DLPackExchangeAPI* api, void* obj, int n) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < n; ++i) {
    DLManagedTensorVersioned* t = NULL;
    if (api->managed_tensor_from_py_object_no_sync(obj, &t) != 0) return -1;
    t->deleter(t);
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
}

/* The same for the non-owning form. */
double view_ns(const DLPackExchangeAPI* api, void* obj, int n) {
  struct timespec a, b;
  DLTensor t;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < n; ++i) {
    if (api->dltensor_from_py_object_no_sync(obj, &t) != 0) return -1;
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
}

/* The table's functions given NULL outputs: each must refuse, not write. */
int take_into_null(const DLPackExchangeAPI* api, void* obj) {
  return api->managed_tensor_from_py_object_no_sync(obj, NULL);
}

int view_into_null(const DLPackExchangeAPI* api, void* obj) {
  return api->dltensor_from_py_object_no_sync(obj, NULL);
}
