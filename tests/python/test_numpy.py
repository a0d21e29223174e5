"""NumPy as producer and consumer: Debian's 1.24, and today's 2.x from PyPI
(the peers' virtual environment). Where the two behave differently, each
version's behaviour is asserted."""
import ctypes
import sys

import numpy as np
import pytest

import dlasync
from dlpack_producer import READ_ONLY, CountingProducer

# NumPy 2 exports bool and read-only arrays (READ_ONLY set); 1.24 refuses both.
NUMPY2 = int(np.__version__.split(".")[0]) >= 2

NUMPY_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "complex64", "complex128"]


def sample(dtype, shape=(6, 5)):
    a = np.arange(np.prod(shape)).reshape(shape)
    if np.dtype(dtype).kind == "c":
        return (a + 1j * a).astype(dtype)
    return a.astype(dtype)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_every_numpy_dtype_is_viewed_and_handed_back(rt, dtype):
    a = sample(dtype)
    base = sys.getrefcount(a)
    t = rt.from_dlpack(a)
    assert t.is_view and not t.is_copy
    assert t.dtype == dtype
    assert t.shape == a.shape and t.strides == (5, 1)
    assert t.data_ptr == a.ctypes.data
    back = np.from_dlpack(t)
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)
    assert sys.getrefcount(a) > base
    del t, back
    assert sys.getrefcount(a) == base  # NumPy's deleter ran, once


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_every_numpy_dtype_is_copied_to_another_device(rt, dtype):
    a = sample(dtype)
    t = rt.from_dlpack(a, device="cpu:1")
    assert t.is_copy and t.device == "cpu:1"
    assert t.data_ptr != a.ctypes.data
    np.testing.assert_array_equal(np.from_dlpack(t), a)


def test_bool_from_a_producer_that_exports_it(rt):
    a = np.array([[True, False, True], [False, False, True]])
    p = CountingProducer(a)
    t = rt.from_dlpack(p)
    assert t.dtype == "bool" and t.is_view
    c = rt.from_dlpack(t, device="cpu:1")
    assert c.dtype == "bool" and c.is_copy
    # NumPy 1.24 cannot take DLPack bool (its from_dlpack fails with a
    # SystemError): read the copy's bytes instead.
    raw = (ctypes.c_uint8 * a.size).from_address(c.data_ptr)
    assert list(raw) == a.astype(np.uint8).ravel().tolist()
    del t
    assert p.deletes == 1
    if NUMPY2:
        # NumPy 2 exports bool, and takes it back.
        v = rt.from_dlpack(a)
        assert v.dtype == "bool" and v.is_view and v.data_ptr == a.ctypes.data
        back = np.from_dlpack(rt.from_dlpack(v, device="cpu:1"))
        assert back.dtype == np.bool_
        np.testing.assert_array_equal(back, a)
    else:
        # NumPy 1.24 refuses to export bool itself: its error reaches the caller.
        with pytest.raises((BufferError, TypeError)):
            rt.from_dlpack(a)


@pytest.mark.parametrize("dtype", ["longdouble", "clongdouble", "datetime64[s]", "object",
                                   "U3", "V8"])
def test_numpy_dtypes_dlpack_cannot_carry_are_refused_by_numpy(rt, dtype):
    a = np.zeros(3, dtype=dtype)
    with pytest.raises((BufferError, TypeError)):
        rt.from_dlpack(a)


LAYOUTS = {
    "slice": lambda a: a[::2, 1:],
    "transpose": lambda a: a.T,
    "reversed rows": lambda a: a[::-1],
    "reversed both": lambda a: a[::-1, ::-2],
    "column": lambda a: a[:, 3],
    "zero-size": lambda a: a[:0],
    "zero-d": lambda a: a[2, 3],
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("copy", [None, True, False])
def test_layouts_with_each_copy_mode(rt, layout, copy):
    base = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    a = np.asarray(LAYOUTS[layout](base))
    t = rt.from_dlpack(a, copy=copy, require_writable=False)
    assert t.is_copy == (copy is True)
    assert t.shape == a.shape
    if t.is_view and a.size:
        assert t.strides == tuple(s // a.itemsize for s in a.strides)
    host = rt.from_dlpack(t, device="cpu:1")  # compact, writable, NumPy can take it
    assert host.is_contiguous
    np.testing.assert_array_equal(np.from_dlpack(host), a)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layouts_made_contiguous(rt, layout):
    a = np.asarray(LAYOUTS[layout](np.arange(48, dtype=np.int64).reshape(8, 6)))
    t = rt.from_dlpack(a, require_contiguous=True)
    assert t.is_contiguous
    assert t.is_view == a.flags.c_contiguous
    np.testing.assert_array_equal(np.from_dlpack(rt.from_dlpack(t, device="cpu:1")), a)


def test_negative_strides_are_read_only_views_that_are_exported_only_as_copies(rt):
    a = np.arange(10.0)[::-1]
    t = rt.from_dlpack(a)
    assert t.is_view and t.read_only and t.strides == (-1,)
    # Not exported, versioned or not: PyTorch aborts the process on them.
    with pytest.raises(BufferError, match="negative strides"):
        np.from_dlpack(t)
    with pytest.raises(BufferError, match="require_writable=True"):
        t.__dlpack__(max_version=(1, 3))
    copied = rt.from_dlpack(t.__dlpack__(copy=True))
    assert copied.is_contiguous
    np.testing.assert_array_equal(np.from_dlpack(copied), a)
    w = rt.from_dlpack(a, require_writable=True)
    assert w.is_copy and not w.read_only
    np.testing.assert_array_equal(np.from_dlpack(w), a)


def test_broadcasts_are_imported_from_a_producer_that_exports_them(rt):
    row = np.arange(5, dtype=np.float64)
    b = np.broadcast_to(row, (4, 5))  # stride 0, read-only
    p = CountingProducer(b, flags=READ_ONLY)
    t = rt.from_dlpack(p)
    assert t.is_view and t.read_only and t.strides == (0, 1)
    c = rt.from_dlpack(p, device="cpu:1")
    np.testing.assert_array_equal(np.from_dlpack(c), b)
    del t, c
    assert p.deletes == p.exports == 2


def test_read_only_arrays(rt):
    a = np.arange(12, dtype=np.int32)
    a.flags.writeable = False
    if NUMPY2:
        # NumPy 2 exports them versioned, flagged READ_ONLY: a read-only view.
        v = rt.from_dlpack(a)
        assert v.read_only and v.is_view and v.data_ptr == a.ctypes.data
        w = rt.from_dlpack(a, require_writable=True)
        assert w.is_copy and not w.read_only
        np.testing.assert_array_equal(np.from_dlpack(w), a)
        del v, w
    else:
        # NumPy 1.24 does not export read-only arrays: its BufferError is kept.
        with pytest.raises(BufferError):
            rt.from_dlpack(a)
    p = CountingProducer(a, flags=READ_ONLY)
    t = rt.from_dlpack(p)
    assert t.read_only and t.is_view
    if NUMPY2:
        # NumPy 2 asks for versioned DLPack and keeps the flag.
        back = np.from_dlpack(t)
        assert not back.flags.writeable
        np.testing.assert_array_equal(back, a)
        del back
    else:
        # NumPy 1.24 asks for legacy DLPack, which cannot say read-only.
        with pytest.raises(BufferError, match="read-only"):
            np.from_dlpack(t)
    cap = t.__dlpack__(max_version=(1, 3))  # versioned export keeps the flag
    w = rt.from_dlpack(p, require_writable=True)
    assert w.is_copy and not w.read_only
    del t, w, cap
    assert p.deletes == p.exports == 2


def test_64_mib_array_round_trip(rt):
    a = np.random.default_rng(1).standard_normal(8 << 20)  # 64 MiB of float64
    view = rt.from_dlpack(a)
    assert view.is_view and view.nbytes == 64 << 20
    copy = rt.from_dlpack(a[::-1], device="cpu:1")
    np.testing.assert_array_equal(np.from_dlpack(copy), a[::-1])
    g = rt.from_dlpack(a, device="cuda:1")
    np.testing.assert_array_equal(np.from_dlpack(rt.from_dlpack(g, device="cpu")), a)


@pytest.mark.parametrize("device", ["cuda:0", "cuda:1", (2, 1)])
@pytest.mark.parametrize("layout", ["transpose", "reversed both", "zero-size", "zero-d"])
def test_to_simulated_gpus_and_back(rt, device, layout):
    a = np.asarray(LAYOUTS[layout](np.arange(48, dtype=np.float32).reshape(8, 6)))
    g = rt.from_dlpack(a, device=device)
    assert g.device == device and g.is_copy and rt.is_simulated(g.device)
    assert g.__dlpack_device__() == (2, dlasync.Device(device).id)
    with pytest.raises(BufferError, match="simulated GPU"):
        np.from_dlpack(g)
    back = rt.from_dlpack(g, device="cpu")
    np.testing.assert_array_equal(np.from_dlpack(back), a)
    # __dlpack__(dl_device=...) makes the copy for the consumer.
    cap_back = np.from_dlpack(rt.from_dlpack(g.__dlpack__(max_version=(1, 0),
                                                           dl_device=(1, 0))))
    np.testing.assert_array_equal(cap_back, a)


def test_a_capsule_is_renamed_once_consumed_and_not_when_refused(rt):
    a = np.arange(6.0)
    cap = a.__dlpack__()
    with pytest.raises(ValueError, match="copy"):
        rt.from_dlpack(cap, device="cpu:1", copy=False)
    assert "used" not in repr(cap)  # refused: still NumPy's, still importable
    t = rt.from_dlpack(cap)
    assert "used_dltensor" in repr(cap)
    with pytest.raises(BufferError, match="consumed already"):
        rt.from_dlpack(cap)
    np.testing.assert_array_equal(np.from_dlpack(t), a)
