"""PyTorch 2 (from PyPI) offers DLPack 1.3's C exchange API on torch.Tensor:
dlasync takes its tensors through the table, with no __dlpack__ call. PyTorch
takes dlasync tensors through __dlpack__ (its from_dlpack does not read a
producer's table)."""
import numpy as np

import dlasync
from conftest import eventually, peer
from dlpack_producer import CountingProducer

torch = peer("torch")


def test_torch_offers_the_table_and_dlasync_takes_it(rt, monkeypatch):
    assert type(torch.Tensor.__dlpack_c_exchange_api__).__name__ == "PyCapsule"
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    calls = []
    monkeypatch.setattr(torch.Tensor, "__dlpack__", lambda *a, **k: calls.append(1))
    t = rt.from_dlpack(x)
    c = rt.from_dlpack(x.t(), device="cuda:1")
    monkeypatch.undo()
    assert calls == []
    assert t.is_view and t.data_ptr == x.data_ptr()
    np.testing.assert_array_equal(np.from_dlpack(rt.from_dlpack(c, device="cpu")), x.t().numpy())


def test_the_read_only_wrapper_is_imported_read_only(rt):
    from torch.utils.dlpack import ReadOnlyTensorWrapper
    x = torch.arange(6.0)
    t = rt.from_dlpack(ReadOnlyTensorWrapper(x))
    assert t.is_view and t.read_only
    w = rt.from_dlpack(ReadOnlyTensorWrapper(x), require_writable=True)
    assert w.is_copy and not w.read_only


def test_torch_takes_dlasync_tensors(rt):
    a = np.arange(10, dtype=np.float32)
    p = CountingProducer(a)
    t = rt.from_dlpack(p)
    y = torch.from_dlpack(t)
    assert y.data_ptr() == a.ctypes.data
    del t, y
    assert eventually(lambda: p.deletes == p.exports == 1)
    assert isinstance(dlasync.from_dlpack(torch.ones(3)), dlasync.Tensor)
