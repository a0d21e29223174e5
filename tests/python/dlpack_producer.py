"""A DLPack producer written with ctypes, for the tests: it counts its
deleter's calls.

CountingProducer(array) exports a NumPy array's memory as a DLPack tensor of
its own making, versioned or legacy, with whatever dtype code, flags, strides
or device the test asks for (bool, READ_ONLY, negative strides, broadcasts,
which NumPy 1.24 and PyTorch 1.13 refuse to export themselves).

Wrapping(obj) takes another producer's capsule (NumPy's, PyTorch's), claims it
as a consumer does (renaming it "used_dltensor"), and hands out a tensor of
its own whose deleter calls the wrapped producer's deleter once and counts it.

A deleter called twice is recorded in `double_deletes` (and never calls the
wrapped deleter again); the tests assert it stays empty.
"""

import ctypes
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_int32, c_int64, c_uint8,
                    c_uint16, c_uint32, c_uint64, c_void_p, py_object)


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


DELETER = CFUNCTYPE(None, c_void_p)


class DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", DELETER)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", DELETER),
                ("flags", c_uint64), ("dl_tensor", DLTensor)]


READ_ONLY = 1
IS_COPIED = 2

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = py_object
_api.PyCapsule_New.argtypes = [c_void_p, c_char_p, c_void_p]
_api.PyCapsule_GetPointer.restype = c_void_p
_api.PyCapsule_GetPointer.argtypes = [py_object, c_char_p]
_api.PyCapsule_GetName.restype = c_char_p
_api.PyCapsule_GetName.argtypes = [py_object]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [py_object, c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [c_void_p, c_char_p]
_api.PyCapsule_GetPointer.restype = c_void_p

# Names must outlive the capsules.
_NAMES = {True: ctypes.create_string_buffer(b"dltensor_versioned"),
          False: ctypes.create_string_buffer(b"dltensor")}
_USED = {True: ctypes.create_string_buffer(b"used_dltensor_versioned"),
         False: ctypes.create_string_buffer(b"used_dltensor")}

_live = {}          # address of a managed tensor -> what keeps it alive
double_deletes = []


def _capsule_destructor(capsule_ptr):
    # Called by Python when a capsule dies: deletes the tensor unless a
    # consumer renamed the capsule.
    for versioned in (True, False):
        name = ctypes.cast(_NAMES[versioned], c_char_p)
        if _api.PyCapsule_IsValid(capsule_ptr, name):
            obj = ctypes.cast(capsule_ptr, py_object)
            addr = _api.PyCapsule_GetPointer(obj, name)
            _live[addr][0].deleter(addr)
            return


_CAPSULE_DESTRUCTOR = CFUNCTYPE(None, c_void_p)(_capsule_destructor)


def _on_delete(addr):
    entry = _live.pop(addr, None)
    if entry is None:
        double_deletes.append(addr)
        return
    entry[1]()


_DELETER = DELETER(_on_delete)


def _make_capsule(managed, versioned, keep, on_delete):
    addr = ctypes.addressof(managed)
    _live[addr] = (managed, on_delete, keep)
    return _api.PyCapsule_New(addr, ctypes.cast(_NAMES[versioned], c_char_p),
                              ctypes.cast(_CAPSULE_DESTRUCTOR, c_void_p))


def _fill(t, data, shape, strides, dtype, device, byte_offset):
    ndim = len(shape)
    shape_arr = (c_int64 * max(ndim, 1))(*shape)
    strides_arr = None if strides is None else (c_int64 * max(ndim, 1))(*strides)
    t.data = data
    t.device = DLDevice(*device)
    t.ndim = ndim
    t.dtype = DLDataType(*dtype)
    t.shape = ctypes.cast(shape_arr, POINTER(c_int64))
    t.strides = None if strides_arr is None else ctypes.cast(strides_arr, POINTER(c_int64))
    t.byte_offset = byte_offset
    return shape_arr, strides_arr


_NUMPY_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


class CountingProducer:
    """Exports a NumPy array's memory; every export's deleter is counted."""

    def __init__(self, array, *, versioned=True, flags=0, dtype=None, device=(1, 0),
                 strides="array", byte_offset=0, version=(1, 3), data=None,
                 shape=None):
        self.array = array
        self.versioned = versioned
        self.flags = flags
        self.dtype = dtype or (_NUMPY_CODES[array.dtype.kind], array.dtype.itemsize * 8, 1)
        self.device = device
        self.byte_offset = byte_offset
        self.version = version
        self.data = data
        self.shape = tuple(array.shape) if shape is None else shape
        if strides == "array":
            strides = [s // array.itemsize for s in array.strides]
        self.strides = strides
        self.exports = 0
        self.deletes = 0
        self.streams = []  # the stream= of each __dlpack__ call

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.streams.append(stream)
        versioned = self.versioned and max_version is not None and max_version[0] >= 1
        data = self.data if self.data is not None else self.array.ctypes.data
        if versioned:
            m = DLManagedTensorVersioned()
            m.version = DLPackVersion(*self.version)
            m.flags = self.flags
            t = m.dl_tensor
        else:
            m = DLManagedTensor()
            t = m.dl_tensor
        arrays = _fill(t, data - self.byte_offset if self.byte_offset else data,
                       self.shape, self.strides, self.dtype, self.device, self.byte_offset)
        m.deleter = _DELETER
        self.exports += 1

        def counted():
            self.deletes += 1
        return _make_capsule(m, versioned, (arrays, self.array), counted)


class Wrapping:
    """Claims another producer's capsule and counts its deleter's calls."""

    def __init__(self, obj):
        self.obj = obj
        self.deletes = 0
        self.exports = 0

    def __dlpack_device__(self):
        return self.obj.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        inner = self.obj.__dlpack__() if stream is None else self.obj.__dlpack__(stream=stream)
        name = _api.PyCapsule_GetName(inner)
        assert name == b"dltensor", name
        addr = _api.PyCapsule_GetPointer(inner, ctypes.cast(_NAMES[False], c_char_p))
        _api.PyCapsule_SetName(inner, ctypes.cast(_USED[False], c_char_p))
        wrapped = DLManagedTensor.from_address(addr)
        m = DLManagedTensor()
        m.dl_tensor = wrapped.dl_tensor
        m.deleter = _DELETER
        inner_deleter = wrapped.deleter
        self.exports += 1

        def counted():
            self.deletes += 1
            inner_deleter(addr)
        return _make_capsule(m, False, (wrapped,), counted)


# DLPack 1.3's C exchange API (dlpack.h's DLPackExchangeAPI), for a producer
# type that offers it as __dlpack_c_exchange_api__.
class DLPackExchangeAPIHeader(Structure):
    _fields_ = [("version", DLPackVersion), ("prev_api", c_void_p)]


FROM_PY = CFUNCTYPE(ctypes.c_int, c_void_p, POINTER(c_void_p))
CURRENT_STREAM = CFUNCTYPE(ctypes.c_int, c_int32, c_int32, POINTER(c_void_p))


class DLPackExchangeAPI(Structure):
    _fields_ = [("header", DLPackExchangeAPIHeader), ("managed_tensor_allocator", c_void_p),
                ("managed_tensor_from_py_object_no_sync", FROM_PY),
                ("managed_tensor_to_py_object_no_sync", c_void_p),
                ("dltensor_from_py_object_no_sync", c_void_p),
                ("current_work_stream", CURRENT_STREAM)]


exchange_calls = {"from_py": 0, "streams": []}


def _exchange_from_py(obj_ptr, out):
    producer = ctypes.cast(obj_ptr, py_object).value
    out[0] = producer._export_versioned()
    exchange_calls["from_py"] += 1
    return 0


def _exchange_stream(device_type, device_id, out):
    exchange_calls["streams"].append((device_type, device_id))
    out[0] = None  # the legacy default stream
    return 0


_FROM_PY = FROM_PY(_exchange_from_py)
_CURRENT_STREAM = CURRENT_STREAM(_exchange_stream)
_EXCHANGE_NAME = ctypes.create_string_buffer(b"dlpack_exchange_api")
_tables = []


def exchange_table(major=1, prev=None, minor=3):
    api = DLPackExchangeAPI()
    api.header.version = DLPackVersion(major, minor)
    api.header.prev_api = None if prev is None else ctypes.addressof(prev)
    api.managed_tensor_from_py_object_no_sync = _FROM_PY
    api.current_work_stream = _CURRENT_STREAM
    _tables.append(api)  # the table lives for the process, as the protocol says
    return api


def exchange_capsule(address, name=_EXCHANGE_NAME):
    """A capsule holding `address` under `name` (a ctypes string buffer that
    outlives it), as a type's __dlpack_c_exchange_api__."""
    return _api.PyCapsule_New(address, ctypes.cast(name, c_char_p), None)


def exchange_producer_type(api):
    """A CountingProducer type whose instances are exported through `api`;
    its __dlpack__ still works, and counts its calls."""
    capsule = exchange_capsule(ctypes.addressof(api))

    class ExchangeProducer(CountingProducer):
        __dlpack_c_exchange_api__ = capsule

        def _export_versioned(self):
            cap = CountingProducer.__dlpack__(self, max_version=(1, 3))
            addr = _api.PyCapsule_GetPointer(cap, ctypes.cast(_NAMES[True], c_char_p))
            _api.PyCapsule_SetName(cap, ctypes.cast(_USED[True], c_char_p))
            return addr

        def __dlpack__(self, **kw):
            self.dlpack_calls += 1
            return CountingProducer.__dlpack__(self, **kw)

    ExchangeProducer.dlpack_calls = 0
    return ExchangeProducer
