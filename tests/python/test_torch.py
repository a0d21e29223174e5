"""PyTorch as producer and consumer: Debian's 1.13, and today's 2.x from PyPI
(the peers' virtual environment). Where the two behave differently, each
version's behaviour is asserted."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import eventually  # noqa: E402
from dlpack_producer import READ_ONLY, CountingProducer, Wrapping  # noqa: E402

# PyTorch before 2.x asks for legacy DLPack only, which cannot say read-only.
TORCH_ASKS_LEGACY = int(torch.__version__.split(".")[0]) < 2


def refused_as_read_only(t):
    if TORCH_ASKS_LEGACY:
        with pytest.raises(BufferError, match="read-only"):
            torch.from_dlpack(t)
    else:
        torch.from_dlpack(t)  # versioned, flagged READ_ONLY


TORCH_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                torch.float16, torch.bfloat16, torch.float32, torch.float64,
                torch.complex64, torch.complex128]


def sample(dtype, shape=(6, 5)):
    return torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape).to(dtype)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_every_torch_dtype_is_viewed_and_handed_back(rt, dtype):
    x = sample(dtype)
    w = Wrapping(x)
    t = rt.from_dlpack(w)
    assert t.is_view and t.data_ptr == x.data_ptr()
    assert t.dtype == str(dtype).replace("torch.", "")
    y = torch.from_dlpack(t)
    assert y.dtype == dtype and torch.equal(y, x)
    y[0, 0] = 7  # a view: the same memory
    assert x[0, 0] == 7
    del t, y
    # PyTorch frees the storage with the GIL released: the deleter runs on
    # dlasync's releaser, once.
    assert eventually(lambda: w.deletes == w.exports == 1)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_every_torch_dtype_is_copied_to_a_simulated_gpu_and_back(rt, dtype):
    x = sample(dtype).t()
    w = Wrapping(x)
    g = rt.from_dlpack(w, device="cuda:0")
    assert g.is_copy and g.device == "cuda:0"
    assert eventually(lambda: w.deletes == 1)  # a copy lets the source go once read
    back = torch.from_dlpack(rt.from_dlpack(g, device="cpu"))
    assert torch.equal(back, x)


LAYOUTS = {
    "slice": lambda x: x[::2, 1:],
    "transpose": lambda x: x.t(),
    "broadcast": lambda x: x[:1].expand(8, 6),
    "zero-size": lambda x: x[:0],
    "zero-d": lambda x: x[2, 3],
    "permuted 3-d": lambda x: x.reshape(2, 4, 6).permute(2, 0, 1),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("copy", [None, True, False])
def test_torch_layouts_with_each_copy_mode(rt, layout, copy):
    x = LAYOUTS[layout](torch.arange(48, dtype=torch.float32).reshape(8, 6))
    w = Wrapping(x)
    t = rt.from_dlpack(w, copy=copy)
    assert t.is_copy == (copy is True)
    assert t.shape == tuple(x.shape)
    if t.is_view and x.numel():
        assert t.strides == tuple(x.stride())
    c = rt.from_dlpack(t, device="cpu:1")
    assert torch.equal(torch.from_dlpack(c), x)
    del t, c
    assert eventually(lambda: w.deletes == 1)


def test_torch_consumes_numpy_negative_strides_only_as_a_copy(rt):
    # PyTorch aborts the process on negative strides: dlasync does not export
    # them, so torch gets an error it can raise, and require_writable gives
    # it a compact copy.
    a = np.arange(12.0).reshape(3, 4)[::-1, ::-1]
    view = rt.from_dlpack(a)
    with pytest.raises(BufferError, match="negative strides"):
        torch.from_dlpack(view)
    copy = rt.from_dlpack(a, require_writable=True)
    assert torch.equal(torch.from_dlpack(copy), torch.from_numpy(a.copy()))


def test_torch_broadcasts_are_read_only_views(rt):
    x = torch.arange(5.0).expand(3, 5)
    t = rt.from_dlpack(x)
    assert t.is_view and t.read_only and t.strides == (0, 1)
    refused_as_read_only(t)
    assert torch.equal(torch.from_dlpack(rt.from_dlpack(x, require_writable=True)), x)


def test_torch_and_numpy_exchange_through_dlasync(rt):
    a = np.arange(20, dtype=np.int32).reshape(4, 5)
    x = torch.from_dlpack(rt.from_dlpack(a))
    assert x.data_ptr() == a.ctypes.data
    g = rt.from_dlpack(x.t(), device="cuda:1")
    np.testing.assert_array_equal(np.from_dlpack(rt.from_dlpack(g, device="cpu")), a.T)


def test_bool_tensors_from_a_producer_that_exports_them(rt):
    a = np.array([True, False, True, True])
    p = CountingProducer(a)
    t = rt.from_dlpack(p)
    assert t.dtype == "bool"
    if TORCH_ASKS_LEGACY:
        with pytest.raises((BufferError, RuntimeError, TypeError)):
            torch.tensor([True]).__dlpack__()  # PyTorch 1.13 does not export bool
    else:
        # PyTorch 2 takes dlasync's bool, and exports its own.
        back = torch.from_dlpack(rt.from_dlpack(t, device="cpu:1"))
        assert back.dtype == torch.bool and back.tolist() == a.tolist()
        x = torch.tensor([True, False])
        v = rt.from_dlpack(x)
        assert v.dtype == "bool" and v.is_view and v.data_ptr == x.data_ptr()
        del back, v
    del t
    assert p.deletes == 1


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_torch_dtypes_dlpack_cannot_carry_are_refused_by_one_side(rt):
    # complex32 is DLPack complex of 32 bits, which DLPack does not allow:
    # dlasync refuses it before taking it; bool PyTorch 1.13 refuses itself
    # (PyTorch 2 exports it).
    x = torch.zeros(4, dtype=torch.complex32)
    with pytest.raises(BufferError, match="complex") as e:
        rt.from_dlpack(x)
    assert e.value.rule == "dtype" and not e.value.consumed
    if TORCH_ASKS_LEGACY:
        with pytest.raises((BufferError, RuntimeError, TypeError)):
            rt.from_dlpack(torch.zeros(4, dtype=torch.bool))
    else:
        assert rt.from_dlpack(torch.zeros(4, dtype=torch.bool)).dtype == "bool"


def test_read_only_flag_from_a_versioned_producer(rt):
    a = np.arange(6, dtype=np.float32)
    p = CountingProducer(a, flags=READ_ONLY)
    t = rt.from_dlpack(p)
    assert t.read_only
    refused_as_read_only(t)
    del t
    assert p.deletes == 1
