"""On a real GPU (skipped without one): PyTorch CUDA tensors on their
streams, CuPy and JAX arrays, imported by dlasync and handed back.

Runs under pytest, or as a script where pytest is missing
(`python3 tests/python/test_gpu_frameworks.py`)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import dlasync  # noqa: E402

try:
    import torch
    HAVE_CUDA = torch.cuda.is_available()
except ImportError:
    torch = None
    HAVE_CUDA = False

try:
    import pytest
    pytestmark = pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA GPU (PyTorch sees none)")
except ImportError:
    pytest = None


def make_rt():
    return dlasync.Runtime(cuda="real")


def raises(kind, fn):
    try:
        fn()
    except kind as e:
        return e
    raise AssertionError(f"{kind.__name__} not raised")


def test_torch_cuda_tensor_on_its_own_stream():
    # The producer's work is still running on a side stream when dlasync
    # imports: dlasync passes its stream to __dlpack__, PyTorch makes it
    # wait, and the import follows it. No host synchronization in between.
    with make_rt() as rt:
        s = torch.cuda.Stream()
        n = 1 << 24
        with torch.cuda.stream(s):
            x = torch.ones(n, device="cuda")
            for _ in range(20):
                x = x * 1.0001 + 0.5  # long enough to still be running
            host = rt.from_dlpack(x, device="cpu")
        torch.cuda.synchronize()
        expected_last = x[-1].item()
        got = np.from_dlpack(host)
        assert got[-1] == np.float32(expected_last)
        assert np.all(got == got[0])


def test_torch_cuda_views_and_hand_back():
    with make_rt() as rt:
        x = torch.arange(4096, device="cuda", dtype=torch.float32).reshape(64, 64)
        v = rt.from_dlpack(x)
        assert v.is_view and v.device == "cuda:0" and v.data_ptr == x.data_ptr()
        y = torch.from_dlpack(v)
        assert y.device.type == "cuda" and torch.equal(y, x)
        t = rt.from_dlpack(x.t(), require_contiguous=True)
        assert t.is_copy and torch.equal(torch.from_dlpack(t), x.t())
        a = np.arange(1 << 20, dtype=np.float32)
        g = rt.from_dlpack(a, device="cuda:0")
        assert torch.equal(torch.from_dlpack(g).cpu(), torch.from_numpy(a))


def test_cupy_arrays():
    try:
        import cupy
    except ImportError:
        return
    with make_rt() as rt:
        a = cupy.arange(1 << 20, dtype=cupy.float64)[::2]
        host = rt.from_dlpack(a, device="cpu")
        np.testing.assert_array_equal(np.from_dlpack(host), cupy.asnumpy(a))
        g = rt.from_dlpack(np.arange(1000, dtype=np.int32), device="cuda:0")
        back = cupy.from_dlpack(g)
        np.testing.assert_array_equal(cupy.asnumpy(back), np.arange(1000, dtype=np.int32))


def test_jax_arrays():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        return
    with make_rt() as rt:
        x = jax.device_put(jnp.arange(1 << 16, dtype=jnp.float32), gpus[0])
        host = rt.from_dlpack(x, device="cpu")
        np.testing.assert_array_equal(np.from_dlpack(host), np.asarray(x))
        g = rt.from_dlpack(np.arange(256, dtype=np.float32), device="cuda:0")
        back = jax.dlpack.from_dlpack(g)
        np.testing.assert_array_equal(np.asarray(back), np.arange(256, dtype=np.float32))


def test_torch_exchange_api_when_offered():
    with make_rt() as rt:
        offered = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
        x = torch.arange(1000, device="cuda", dtype=torch.int64)
        host = rt.from_dlpack(x, device="cpu")
        np.testing.assert_array_equal(np.from_dlpack(host), np.arange(1000))
        print(f"PyTorch {torch.__version__} offers the exchange API: {offered}")


def test_async_imports_onto_the_gpu():
    import asyncio
    with make_rt() as rt:
        arrays = [np.full(1 << 16, i, dtype=np.float32) for i in range(64)]

        async def main():
            return await asyncio.gather(*[rt.import_dlpack(a, device="cuda:0") for a in arrays])

        ts = asyncio.run(main())
        for i, t in enumerate(ts):
            assert torch.from_dlpack(t)[0].item() == i


if __name__ == "__main__":
    if not HAVE_CUDA:
        print("skipped: no CUDA GPU (PyTorch sees none)")
        sys.exit(0)
    failed = 0
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"PASSED {name}")
            except Exception as e:  # noqa: BLE001
                failed += 1
                print(f"FAILED {name}: {type(e).__name__}: {e}")
    sys.exit(1 if failed else 0)
