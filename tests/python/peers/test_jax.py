"""JAX (jaxlib's CPU backend, from PyPI) as producer and consumer of dlasync
tensors, on the host and through simulated GPUs."""
import numpy as np
import pytest

from conftest import eventually, peer
from dlpack_producer import CountingProducer

jax = peer("jax")
jnp = jax.numpy


def test_jax_arrays_are_viewed_and_copied(rt):
    x = jnp.arange(24, dtype=jnp.float32).reshape(4, 6)
    t = rt.from_dlpack(x)
    assert t.is_view and t.dtype == "float32" and t.shape == (4, 6)
    g = rt.from_dlpack(x, device="cuda:1")  # a simulated GPU: a copy
    back = rt.from_dlpack(g, device="cpu:0")
    np.testing.assert_array_equal(np.from_dlpack(back), np.asarray(x))


def test_jax_takes_dlasync_tensors_views_and_copies(rt):
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    p = CountingProducer(a)
    view = rt.from_dlpack(p)
    y = jnp.from_dlpack(view)
    np.testing.assert_array_equal(np.asarray(y), a)
    # A transposed copy made compact by dlasync, then read by JAX, which takes
    # only compact (or permuted compact) layouts.
    c = rt.from_dlpack(a.T, device="cpu:0", require_contiguous=True)
    np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(c)), a.T)
    # Through a simulated GPU and back.
    g = rt.from_dlpack(a, device="cuda:0")
    np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(rt.from_dlpack(g, device="cpu"))), a)
    del view, y
    assert eventually(lambda: p.deletes == p.exports == 1)


def test_jax_refuses_a_second_host_device_by_its_ordinal(rt):
    # dlasync's cpu:1 is DLPack (kDLCPU, 1); jaxlib maps the ordinal to one of
    # its own CPU devices and has only cpu:0 here. Its error reaches the caller.
    t = rt.from_dlpack(np.arange(4.0), device="cpu:1")
    with pytest.raises(Exception, match="local_device_id 1"):
        jnp.from_dlpack(t)


def test_jax_bfloat16_and_bool_cross_both_ways(rt):
    for x in [jnp.arange(8, dtype=jnp.bfloat16), jnp.array([True, False, True])]:
        t = rt.from_dlpack(x, device="cpu:1")
        assert t.dtype == ("bfloat16" if x.dtype == jnp.bfloat16 else "bool")
        back = jnp.from_dlpack(rt.from_dlpack(t, device="cpu:0"))
        assert back.dtype == x.dtype
        assert bool(jnp.all(back == x))
