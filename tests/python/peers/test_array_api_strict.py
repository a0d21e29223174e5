"""array-api-strict (from PyPI), the array API standard's reference
namespace, as producer and consumer."""
import numpy as np

from conftest import peer

xp = peer("array_api_strict")


def test_strict_arrays_cross_both_ways(rt):
    x = xp.reshape(xp.arange(12, dtype=xp.float32), (3, 4))
    t = rt.from_dlpack(x)
    assert t.is_view and t.shape == (3, 4) and t.dtype == "float32"
    y = xp.from_dlpack(t)
    assert xp.all(y == x)
    g = rt.from_dlpack(x, device="cuda:0")
    z = xp.from_dlpack(rt.from_dlpack(g, device="cpu"))
    assert xp.all(z == x)
    # copy=True through the standard's own call: dlasync's __dlpack__ copies.
    c = xp.from_dlpack(t, copy=True)
    assert xp.all(c == x)
    np.testing.assert_array_equal(np.from_dlpack(rt.from_dlpack(c)), np.arange(12.0).reshape(3, 4))
