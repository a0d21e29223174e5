"""dlasync takes tensors from a producer written in C against DLPack 1.3's C
exchange API (tests/python/exchange_producer.c): through the table on the
producer's type, never through its __dlpack__ (which raises), with every
deleter counted."""
import asyncio
import gc
import importlib.util
import os

import numpy as np
import pytest

import dlasync
from conftest import eventually


def load_producer():
    path = os.environ.get("DLASYNC_EXCHANGE_PRODUCER")
    if not path:
        pytest.fail("DLASYNC_EXCHANGE_PRODUCER is not set: run the tests through ctest, "
                    "which builds tests/python/exchange_producer.c")
    spec = importlib.util.spec_from_file_location("exchange_producer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


P = load_producer()


def expected(rows, cols=0):
    n = rows * max(cols, 1)
    values = np.arange(n, dtype=np.float64) * 0.5
    return values.reshape((rows, cols)) if cols else values


def settled(takes, deletes):
    gc.collect()
    return eventually(lambda: P.takes() == takes and P.deletes() == deletes)


def test_a_view_shares_the_producers_memory_and_releases_it_once(rt):
    takes, deletes = P.takes(), P.deletes()
    b = P.Buffer(16, 8)
    with pytest.raises(RuntimeError, match="take it through the table"):
        b.__dlpack__()
    t = rt.from_dlpack(b)
    assert P.takes() == takes + 1
    assert t.is_view and t.data_ptr == b.address
    assert t.shape == (16, 8) and t.dtype == "float64" and t.device == "cpu:0"
    assert np.array_equal(np.from_dlpack(t), expected(16, 8))
    del b  # the tensor keeps the producer's object alive
    assert P.deletes() == deletes
    del t
    assert settled(takes + 1, deletes + 1)


@pytest.mark.parametrize("device", ["cpu:1", "cuda:0"])
def test_copies_read_the_producers_memory_then_release_it(rt, device):
    takes, deletes = P.takes(), P.deletes()
    b = P.Buffer(64, 33, every_other_row=True)
    t = rt.from_dlpack(b, device=device)
    assert t.is_copy and t.device == device
    # The copy no longer reads the producer's tensor: it is released.
    assert settled(takes + 1, deletes + 1)
    host = t if device.startswith("cpu") else rt.from_dlpack(t, device="cpu")
    assert np.array_equal(np.from_dlpack(host), expected(64, 33))


def test_a_strided_tensor_becomes_compact_on_request(rt):
    takes, deletes = P.takes(), P.deletes()
    b = P.Buffer(100, every_other_row=True)  # one dimension, stride 2
    t = rt.from_dlpack(b, require_contiguous=True)
    assert t.is_copy and t.is_contiguous and t.strides == (1,)
    assert np.array_equal(np.from_dlpack(t), expected(100))
    assert settled(takes + 1, deletes + 1)


def test_the_producers_refusal_reaches_the_caller_and_nothing_is_taken(rt):
    takes, deletes = P.takes(), P.deletes()
    b = P.Buffer(4, fail=True)
    with pytest.raises(BufferError, match="refuses to be taken"):
        rt.from_dlpack(b)
    assert P.takes() == takes and P.deletes() == deletes


def test_a_refused_import_gives_the_tensor_back_to_its_deleter(rt):
    takes, deletes = P.takes(), P.deletes()
    b = P.Buffer(4, 4, every_other_row=True)
    with pytest.raises(ValueError, match="copy"):
        rt.from_dlpack(b, copy=False, require_contiguous=True)
    assert settled(takes + 1, deletes + 1)


def test_awaited_imports_and_batches_take_through_the_table(rt):
    takes, deletes = P.takes(), P.deletes()
    buffers = [P.Buffer(32, 4) for _ in range(20)]

    async def main():
        one = await rt.import_dlpack(buffers[0], device="cuda:1")
        many = await rt.import_batch(buffers[1:], device="cpu:1")
        return [one] + many

    tensors = asyncio.run(main())
    host = rt.from_dlpack(tensors[0], device="cpu")
    assert np.array_equal(np.from_dlpack(host), expected(32, 4))
    for t in tensors[1:]:
        assert np.array_equal(np.from_dlpack(t), expected(32, 4))
    del tensors, host
    assert settled(takes + 20, deletes + 20)
