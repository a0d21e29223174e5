"""tvm-ffi (apache-tvm-ffi, from PyPI) as producer and consumer. Its
from_dlpack takes dlasync tensors through dlasync's C exchange API, with no
__dlpack__ call."""
import numpy as np
import pytest

import dlasync
from conftest import eventually, peer
from dlpack_producer import CountingProducer

tvm_ffi = peer("tvm_ffi")


def test_tvm_ffi_takes_dlasync_tensors_through_the_exchange_api(rt, monkeypatch):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = CountingProducer(a)
    t = rt.from_dlpack(p)
    calls = []
    # A __dlpack__ call would show here; the exchange API makes none.
    monkeypatch.setattr(dlasync.Tensor, "__dlpack__",
                        lambda *a, **k: calls.append(1) or pytest.fail("__dlpack__ was called"))
    f = tvm_ffi.from_dlpack(t)
    assert calls == []
    assert tuple(f.shape) == (3, 4) and str(f.dtype) == "float32"
    monkeypatch.undo()
    np.testing.assert_array_equal(np.from_dlpack(f), a)
    del t
    assert p.deletes == 0  # tvm-ffi's tensor holds it
    del f
    assert eventually(lambda: p.deletes == p.exports == 1)


def test_tvm_ffi_sees_dlasync_refusals(rt):
    g = rt.from_dlpack(np.arange(4.0), device="cuda:0")
    with pytest.raises(BufferError, match="simulated GPU"):
        tvm_ffi.from_dlpack(g)
    r = rt.from_dlpack(np.arange(6.0)[::-1])
    with pytest.raises(BufferError, match="negative strides"):
        tvm_ffi.from_dlpack(r)


def test_dlasync_takes_tvm_ffi_tensors(rt):
    a = np.arange(20, dtype=np.int64).reshape(4, 5)
    f = tvm_ffi.from_dlpack(a)
    t = rt.from_dlpack(f)
    assert t.is_view and t.data_ptr == a.ctypes.data
    g = rt.from_dlpack(f, device="cuda:1")
    np.testing.assert_array_equal(np.from_dlpack(rt.from_dlpack(g, device="cpu")), a)
