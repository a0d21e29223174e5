"""dlasync.Tensor offers DLPack 1.3's C exchange API: a consumer written in C
(exchange_consumer.c, loaded with ctypes) takes tensors through the table
with no Python call, and every deleter runs once."""
import ctypes
import os
from ctypes import POINTER, Structure, c_char, c_double, c_int, c_int32, c_int64, c_uint8, \
    c_uint16, c_uint32, c_uint64, c_void_p, py_object

import numpy as np
import pytest

import dlasync
import dlpack_producer as dp
from conftest import eventually


class Seen(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32), ("flags", c_uint64),
                ("data", c_void_p), ("device_type", c_int32), ("device_id", c_int32),
                ("ndim", c_int32), ("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16),
                ("shape", c_int64 * 8), ("strides", c_int64 * 8), ("byte_offset", c_uint64),
                ("first", c_double)]


class ErrorBox(Structure):
    _fields_ = [("kind", c_char * 64), ("message", c_char * 512), ("calls", c_int)]


def load_consumer():
    path = os.environ.get("DLASYNC_EXCHANGE_CONSUMER")
    if not path:
        pytest.fail("DLASYNC_EXCHANGE_CONSUMER is not set: run the tests through ctest, "
                    "which builds tests/python/exchange_consumer.c")
    lib = ctypes.PyDLL(path)  # keeps the GIL: the table is called as from Python
    lib.take.argtypes = [c_void_p, py_object, POINTER(Seen), POINTER(c_void_p)]
    lib.release.argtypes = [c_void_p]
    lib.view.argtypes = [c_void_p, py_object, POINTER(Seen)]
    lib.stream_of.argtypes = [c_void_p, c_int32, c_int32, POINTER(c_void_p)]
    lib.allocate.argtypes = [c_void_p, c_int32, c_int32, c_uint8, c_uint8, c_int32,
                             POINTER(c_int64), POINTER(c_void_p), POINTER(ErrorBox)]
    lib.to_object.argtypes = [c_void_p, c_void_p, POINTER(c_void_p)]
    for f in (lib.take, lib.view, lib.stream_of, lib.allocate, lib.to_object):
        f.restype = c_int
    lib.take_into_null.argtypes = [c_void_p, py_object]
    lib.view_into_null.argtypes = [c_void_p, py_object]
    lib.take_into_null.restype = lib.view_into_null.restype = c_int
    lib.take_release_ns.argtypes = [c_void_p, py_object, c_int]
    lib.take_release_ns.restype = c_double
    return lib


C = load_consumer()
API = ctypes.pythonapi.PyCapsule_GetPointer(dlasync.Tensor.__dlpack_c_exchange_api__,
                                            b"dlpack_exchange_api")


def take(obj):
    seen, kept = Seen(), c_void_p()
    assert C.take(API, obj, ctypes.byref(seen), ctypes.byref(kept)) == 0
    return seen, kept


def test_the_table_is_on_the_type_as_dlpack_asks():
    api = dlasync.Tensor.__dlpack_c_exchange_api__
    assert type(api).__name__ == "PyCapsule"
    header = dp.DLPackExchangeAPIHeader.from_address(API)
    assert (header.version.major, header.version.minor) == (1, 3)
    assert header.prev_api is None
    # Every function DLPack requires is there, and the optional one too.
    assert all(c_void_p.from_address(API + 16 + 8 * i).value for i in range(5))


def test_a_consumer_in_c_takes_a_view_and_its_deleter_ends_the_producers_tensor(rt):
    a = np.arange(12, dtype=np.float32).reshape(3, 4) + 7
    p = dp.CountingProducer(a)
    t = rt.from_dlpack(p)
    seen, kept = take(t)
    assert (seen.major, seen.minor) == (1, 3) and seen.flags == 0
    assert seen.data == a.ctypes.data and seen.byte_offset == 0
    assert (seen.device_type, seen.device_id, seen.ndim) == (1, 0, 2)
    assert (seen.code, seen.bits, seen.lanes) == (2, 32, 1)
    assert list(seen.shape[:2]) == [3, 4] and list(seen.strides[:2]) == [4, 1]
    assert seen.first == 7.0
    del t
    assert p.deletes == 0  # the C consumer still holds it
    C.release(kept)
    assert eventually(lambda: p.deletes == p.exports == 1)


def test_a_strided_copy_keeps_its_layout_and_offset(rt):
    a = np.arange(48, dtype=np.float64).reshape(6, 8)
    t = rt.from_dlpack(a[1::2, 2:], device="cpu:1")
    seen, kept = take(t)
    assert list(seen.shape[:2]) == [3, 6]
    assert seen.first == a[1, 2]
    C.release(kept)


def test_read_only_is_kept_and_the_bare_dltensor_refuses_it(rt):
    a = np.arange(6, dtype=np.float32)
    p = dp.CountingProducer(a, flags=dp.READ_ONLY)
    t = rt.from_dlpack(p)
    seen, kept = take(t)
    assert seen.flags & dp.READ_ONLY
    C.release(kept)
    with pytest.raises(BufferError, match="read-only"):
        C.view(API, t, ctypes.byref(Seen()))
    w = rt.from_dlpack(p, require_writable=True)
    v = Seen()
    assert C.view(API, w, ctypes.byref(v)) == 0
    assert v.data == w.data_ptr and v.first == 0.0 and list(v.strides[:1]) == [1]
    del t, w
    assert eventually(lambda: p.deletes == p.exports == 2)


def test_refusals_are_those_of_dunder_dlpack(rt):
    g = rt.from_dlpack(np.arange(4.0), device="cuda:0")
    with pytest.raises(BufferError, match="simulated GPU"):
        take(g)
    with pytest.raises(BufferError, match="simulated GPU"):
        C.view(API, g, ctypes.byref(Seen()))
    r = rt.from_dlpack(np.arange(6.0)[::-1])
    with pytest.raises(BufferError, match="negative strides"):
        take(r)
    with pytest.raises(TypeError, match="takes a dlasync.Tensor, not ndarray"):
        take(np.arange(3.0))
    # A Tensor made without an import holds nothing to export.
    empty = dlasync.Tensor.__new__(dlasync.Tensor)
    with pytest.raises(TypeError, match="holds no tensor"):
        take(empty)
    with pytest.raises(TypeError, match="holds no tensor"):
        rt.from_dlpack(empty)
    # NULL outputs are refused, not written.
    t = rt.from_dlpack(np.arange(3.0))
    with pytest.raises(ValueError, match="out is NULL"):
        C.take_into_null(API, t)
    with pytest.raises(ValueError, match="out is NULL"):
        C.view_into_null(API, t)


def test_current_work_stream_is_null(rt):
    for device in [(1, 0), (2, 0), (2, 1)]:
        out = c_void_p()
        assert C.stream_of(API, *device, ctypes.byref(out)) == 0
        assert out.value is None


def test_to_object_makes_a_tensor_that_owns_the_producers_tensor(rt, monkeypatch):
    monkeypatch.setattr(dlasync, "_default", rt)
    a = np.arange(10, dtype=np.int32)
    p = dp.CountingProducer(a)
    cap = p.__dlpack__(max_version=(1, 3))
    managed = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    ctypes.pythonapi.PyCapsule_SetName(cap, b"used_dltensor_versioned")  # the C side owns it
    out = c_void_p()
    assert C.to_object(API, managed, ctypes.byref(out)) == 0
    t = ctypes.cast(out, py_object).value
    ctypes.pythonapi.Py_DecRef(py_object(t))  # the new reference to_object returned
    assert isinstance(t, dlasync.Tensor) and t.is_view and t.data_ptr == a.ctypes.data
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    del t, cap
    assert eventually(lambda: p.deletes == p.exports == 1)


def test_to_object_makes_a_view_or_nothing(rt, monkeypatch):
    # A float32 tensor one byte off its alignment needs a copy to be imported:
    # to_object promises a Tensor of the caller's memory, so it refuses.
    monkeypatch.setattr(dlasync, "_default", rt)
    a = np.zeros(9, dtype=np.float32)
    p = dp.CountingProducer(a[:8], data=a.ctypes.data + 1)
    cap = p.__dlpack__(max_version=(1, 3))
    managed = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    ctypes.pythonapi.PyCapsule_SetName(cap, b"used_dltensor_versioned")
    out = c_void_p(12345)
    with pytest.raises(ValueError, match="copy"):
        C.to_object(API, managed, ctypes.byref(out))
    assert out.value is None  # set to NULL on failure
    del cap
    assert eventually(lambda: p.deletes == p.exports == 1)


def test_to_object_of_a_refused_tensor_raises_and_deletes_it_once(rt, monkeypatch):
    monkeypatch.setattr(dlasync, "_default", rt)
    p = dp.CountingProducer(np.zeros(4, dtype=np.float32), dtype=(5, 32, 1))  # complex32
    cap = p.__dlpack__(max_version=(1, 3))
    managed = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    ctypes.pythonapi.PyCapsule_SetName(cap, b"used_dltensor_versioned")
    with pytest.raises(BufferError, match="complex"):
        C.to_object(API, managed, ctypes.byref(c_void_p()))
    del cap
    assert eventually(lambda: p.deletes == p.exports == 1)


def allocate(device, shape, code=2, bits=32):
    dims = (c_int64 * max(len(shape), 1))(*shape)
    out, box = c_void_p(), ErrorBox()
    rc = C.allocate(API, device[0], device[1], code, bits, len(shape), dims, ctypes.byref(out),
                    ctypes.byref(box))
    return rc, out, box


def test_the_allocator_gives_compact_host_memory_that_becomes_a_tensor(rt, monkeypatch):
    monkeypatch.setattr(dlasync, "_default", rt)
    rc, out, box = allocate((1, 1), (4, 5))
    assert rc == 0 and box.calls == 0
    m = dp.DLManagedTensorVersioned.from_address(out.value)
    assert (m.version.major, m.version.minor) == (1, 3)
    assert m.dl_tensor.data % 64 == 0 and m.dl_tensor.ndim == 2
    assert [m.dl_tensor.shape[i] for i in range(2)] == [4, 5]
    assert [m.dl_tensor.strides[i] for i in range(2)] == [5, 1]
    ctypes.memset(m.dl_tensor.data, 0, 80)
    obj = c_void_p()
    assert C.to_object(API, out, ctypes.byref(obj)) == 0
    t = ctypes.cast(obj, py_object).value
    ctypes.pythonapi.Py_DecRef(py_object(t))
    assert t.device == "cpu:1" and t.shape == (4, 5)
    host = np.from_dlpack(rt.from_dlpack(t, device="cpu:0", copy=True))
    assert host.sum() == 0.0
    del t
    # A zero-size tensor, and one released straight away.
    rc, out, _ = allocate((1, 0), (0, 3))
    assert rc == 0
    C.release(out)
    # Zero-size, with extents whose product passes 2^63 only with the first
    # one, which no stride needs: accepted, strides exact.
    rc, out, box = allocate((1, 0), (1 << 40, 0, 1 << 40))
    assert rc == 0, box.message
    m = dp.DLManagedTensorVersioned.from_address(out.value)
    assert [m.dl_tensor.strides[i] for i in range(3)] == [1 << 40, 1 << 40, 1]
    C.release(out)


@pytest.mark.parametrize("device, shape, code, bits, kind, words", [
    ((1, 0), (2, -1), 2, 32, "ValueError", "shape[1] is -1"),
    ((1, 0), (1 << 40, 1 << 40), 2, 32, "ValueError", "overflows"),
    ((1, 0), (0, 1 << 40, 1 << 40), 2, 32, "ValueError", "strides overflow"),
    ((1, 0), (4,), 2, 0, "ValueError", "bits 0"),
    ((2, 0), (4,), 2, 32, "BufferError", "simulated GPU"),
    ((1, 9), (4,), 2, 32, "ValueError", "cpu:9"),
    ((7, 0), (4,), 2, 32, "ValueError", "vulkan"),
])
def test_the_allocator_reports_what_it_refuses_through_set_error(rt, monkeypatch, device, shape,
                                                                  code, bits, kind, words):
    monkeypatch.setattr(dlasync, "_default", rt)
    rc, out, box = allocate(device, shape, code, bits)
    assert rc == -1 and box.calls == 1 and out.value is None
    assert box.kind.decode() == kind, box.message
    assert words in box.message.decode()


def test_the_allocator_takes_the_gil_itself(rt, monkeypatch):
    # DLPack lets a consumer call the allocator without the GIL: through
    # ctypes.CDLL the GIL is released during the call.
    monkeypatch.setattr(dlasync, "_default", rt)
    free_lib = ctypes.CDLL(os.environ["DLASYNC_EXCHANGE_CONSUMER"])
    free_lib.allocate.argtypes = C.allocate.argtypes
    free_lib.allocate.restype = c_int
    free_lib.release.argtypes = [c_void_p]
    dims = (c_int64 * 1)(1000)
    out, box = c_void_p(), ErrorBox()
    assert free_lib.allocate(API, 1, 0, 2, 64, 1, dims, ctypes.byref(out), ctypes.byref(box)) == 0
    m = dp.DLManagedTensorVersioned.from_address(out.value)
    assert m.dl_tensor.shape[0] == 1000 and m.dl_tensor.dtype.bits == 64
    free_lib.release(out)  # the deleter needs no GIL either
    bad = (c_int64 * 1)(-5)
    assert free_lib.allocate(API, 1, 0, 2, 32, 1, bad, ctypes.byref(out), ctypes.byref(box)) == -1
    assert box.kind == b"ValueError" and b"shape[0] is -5" in box.message
