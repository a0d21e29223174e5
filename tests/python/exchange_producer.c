/* A producer of DLPack 1.3's C exchange API written in C, for the Python
 * tests: an extension module whose type `Buffer` (float64 numbers, one or two
 * dimensions, optionally every other row of a larger block) offers its
 * tensors through a table on the type, `__dlpack_c_exchange_api__`, as
 * PyTorch and tvm-ffi do. A consumer that reads the table takes tensors with
 * no Python call; this type's `__dlpack__` raises, so a test sees at once
 * if a consumer falls back to it.
 *
 *   Buffer(rows, cols=0, every_other_row=False, fail=False)
 *       element i (in row-major order of what the tensor shows) is i * 0.5;
 *       fail=True makes the table's take fail with a BufferError set
 *   Buffer.address          the first element's address
 *   takes(), deletes()      the table's takes, and its tensors' deleters run
 *
 * DLPack's declarations are in dlpack_exchange.h. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#include "dlpack_exchange.h"

enum { kDLCPU = 1, kDLFloat = 2 };

typedef struct {
  PyObject_HEAD
  double* block; /* rows * (every_other_row ? 2 : 1) * cols numbers */
  int ndim;
  int64_t shape[2];
  int64_t strides[2];
  int fail;
} Buffer;

/* One taken tensor: the DLPack struct, its own shape and strides, and a
 * reference to the Buffer that owns the memory. */
typedef struct {
  DLManagedTensorVersioned managed;
  int64_t shape[2];
  int64_t strides[2];
  PyObject* owner;
} Taken;

static PyTypeObject* buffer_type = NULL;
static long takes = 0;
static long deletes = 0;

static void taken_deleter(DLManagedTensorVersioned* self) {
  Taken* t = (Taken*)self->manager_ctx;
  /* Any thread: a consumer may let go of the tensor without the GIL. */
  PyGILState_STATE gil = PyGILState_Ensure();
  ++deletes;
  Py_DECREF(t->owner);
  PyGILState_Release(gil);
  free(t);
}

static void fill_tensor(Buffer* b, DLTensor* out, int64_t* shape, int64_t* strides) {
  out->data = b->block;
  out->device.device_type = kDLCPU;
  out->device.device_id = 0;
  out->ndim = b->ndim;
  out->dtype.code = kDLFloat;
  out->dtype.bits = 64;
  out->dtype.lanes = 1;
  for (int i = 0; i < b->ndim; ++i) {
    shape[i] = b->shape[i];
    strides[i] = b->strides[i];
  }
  out->shape = shape;
  out->strides = strides;
  out->byte_offset = 0;
}

static int check_buffer(void* py_object, const char* function) {
  if (py_object == NULL || !PyObject_TypeCheck((PyObject*)py_object, buffer_type)) {
    PyErr_Format(PyExc_TypeError, "%s takes an exchange_producer.Buffer", function);
    return -1;
  }
  if (((Buffer*)py_object)->fail) {
    PyErr_SetString(PyExc_BufferError, "this Buffer refuses to be taken (fail=True)");
    return -1;
  }
  return 0;
}

static int from_py_object(void* py_object, DLManagedTensorVersioned** out) {
  if (out == NULL) {
    PyErr_SetString(PyExc_ValueError, "out is NULL");
    return -1;
  }
  *out = NULL;
  if (check_buffer(py_object, "managed_tensor_from_py_object_no_sync") != 0) return -1;
  Taken* t = (Taken*)calloc(1, sizeof(Taken));
  if (t == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  t->managed.version.major = 1;
  t->managed.version.minor = 3;
  t->managed.manager_ctx = t;
  t->managed.deleter = taken_deleter;
  t->managed.flags = 0;
  fill_tensor((Buffer*)py_object, &t->managed.dl_tensor, t->shape, t->strides);
  t->owner = (PyObject*)py_object;
  Py_INCREF(t->owner);
  ++takes;
  *out = &t->managed;
  return 0;
}

static int dltensor_from_py_object(void* py_object, DLTensor* out) {
  if (out == NULL) {
    PyErr_SetString(PyExc_ValueError, "out is NULL");
    return -1;
  }
  if (check_buffer(py_object, "dltensor_from_py_object_no_sync") != 0) return -1;
  Buffer* b = (Buffer*)py_object;
  fill_tensor(b, out, b->shape, b->strides); /* borrowed from the Buffer */
  return 0;
}

static int to_py_object(DLManagedTensorVersioned* tensor, void** out_py_object) {
  (void)tensor;
  if (out_py_object != NULL) *out_py_object = NULL;
  PyErr_SetString(PyExc_NotImplementedError, "exchange_producer makes no objects from tensors");
  return -1;
}

static int allocator(DLTensor* prototype, DLManagedTensorVersioned** out, void* error_ctx,
                     void (*set_error)(void*, const char*, const char*)) {
  (void)prototype;
  if (out != NULL) *out = NULL;
  set_error(error_ctx, "NotImplementedError", "exchange_producer allocates nothing");
  return -1;
}

static int work_stream(int32_t device_type, int32_t device_id, void** out_stream) {
  (void)device_type;
  (void)device_id;
  *out_stream = NULL; /* host memory: no stream */
  return 0;
}

static DLPackExchangeAPI table = {
    {{1, 3}, NULL}, allocator, from_py_object, to_py_object, dltensor_from_py_object, work_stream,
};

static int buffer_init(Buffer* self, PyObject* args, PyObject* kwargs) {
  static char* names[] = {"rows", "cols", "every_other_row", "fail", NULL};
  Py_ssize_t rows = 0;
  Py_ssize_t cols = 0;
  int every_other_row = 0;
  int fail = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|npp", names, &rows, &cols, &every_other_row,
                                   &fail)) {
    return -1;
  }
  if (rows < 1 || cols < 0 || rows > (1 << 20) || cols > (1 << 20)) {
    PyErr_SetString(PyExc_ValueError, "rows from 1 and cols from 0, each at most 2**20");
    return -1;
  }
  const int64_t width = cols == 0 ? 1 : cols;
  const int64_t stored_rows = every_other_row ? 2 * rows : rows;
  free(self->block);
  self->block = (double*)malloc((size_t)(stored_rows * width) * sizeof(double));
  if (self->block == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  int64_t i = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t stored = every_other_row ? 2 * r : r;
    for (int64_t c = 0; c < width; ++c) self->block[stored * width + c] = (double)(i++) * 0.5;
    if (every_other_row) {
      for (int64_t c = 0; c < width; ++c) self->block[(stored + 1) * width + c] = -1.0;
    }
  }
  self->ndim = cols == 0 ? 1 : 2;
  self->shape[0] = rows;
  self->shape[1] = cols;
  self->strides[0] = every_other_row ? 2 * width : width;
  self->strides[1] = 1;
  if (self->ndim == 1) self->strides[0] = every_other_row ? 2 : 1;
  self->fail = fail;
  return 0;
}

static void buffer_dealloc(Buffer* self) {
  free(self->block);
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free((PyObject*)self);
  Py_DECREF(type);
}

static PyObject* buffer_address(Buffer* self, void* closure) {
  (void)closure;
  return PyLong_FromVoidPtr(self->block);
}

static PyObject* buffer_dlpack(PyObject* self, PyObject* args, PyObject* kwargs) {
  (void)self;
  (void)args;
  (void)kwargs;
  PyErr_SetString(PyExc_RuntimeError,
                  "exchange_producer.Buffer.__dlpack__ was called: take it through the table");
  return NULL;
}

static PyObject* buffer_dlpack_device(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  return Py_BuildValue("(ii)", kDLCPU, 0);
}

static PyMethodDef buffer_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))buffer_dlpack, METH_VARARGS | METH_KEYWORDS, NULL},
    {"__dlpack_device__", buffer_dlpack_device, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef buffer_getset[] = {
    {"address", (getter)buffer_address, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot buffer_slots[] = {
    {Py_tp_init, (void*)buffer_init},
    {Py_tp_new, (void*)PyType_GenericNew},
    {Py_tp_dealloc, (void*)buffer_dealloc},
    {Py_tp_methods, buffer_methods},
    {Py_tp_getset, buffer_getset},
    {0, NULL},
};

static PyType_Spec buffer_spec = {"exchange_producer.Buffer", sizeof(Buffer), 0,
                                  Py_TPFLAGS_DEFAULT, buffer_slots};

static PyObject* count_takes(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  return PyLong_FromLong(takes);
}

static PyObject* count_deletes(PyObject* self, PyObject* unused) {
  (void)self;
  (void)unused;
  return PyLong_FromLong(deletes);
}

static PyMethodDef module_methods[] = {
    {"takes", count_takes, METH_NOARGS, NULL},
    {"deletes", count_deletes, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "exchange_producer", NULL, -1,
                                    module_methods};

PyMODINIT_FUNC PyInit_exchange_producer(void) {
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  buffer_type = (PyTypeObject*)PyType_FromSpec(&buffer_spec);
  if (buffer_type == NULL) return NULL;
  PyObject* api = PyCapsule_New(&table, "dlpack_exchange_api", NULL);
  if (api == NULL ||
      PyObject_SetAttrString((PyObject*)buffer_type, "__dlpack_c_exchange_api__", api) != 0) {
    Py_XDECREF(api);
    return NULL;
  }
  Py_DECREF(api);
  Py_INCREF(buffer_type);
  if (PyModule_AddObject(m, "Buffer", (PyObject*)buffer_type) != 0) return NULL;
  return m;
}
