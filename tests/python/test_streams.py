"""The stream protocol, on simulated GPUs: for a CUDA producer dlasync passes
the stream it will follow as `__dlpack__(stream=...)`; the caller may name one
instead. Host producers get no stream."""
import asyncio

import numpy as np
import pytest

import dlasync
from conftest import eventually
from dlpack_producer import CountingProducer, Wrapping


def gpu_producer(rt, values, device="cuda:0"):
    """A producer whose memory lives on a simulated GPU (dlasync's own copy),
    kept alive by the producer."""
    g = rt.from_dlpack(values, device=device)
    p = CountingProducer(values, device=(2, dlasync.Device(device).id), data=g.data_ptr)
    p.keep = g
    return p


def test_a_cuda_producer_is_given_dlasyncs_stream_for_its_gpu(rt):
    a = np.arange(1000, dtype=np.float32)
    p = gpu_producer(rt, a)
    t = rt.from_dlpack(p, device="cpu")
    assert len(p.streams) == 1
    s = p.streams[0]
    assert isinstance(s, int) and s not in (None, -1, 0, 1, 2)  # a stream of its own
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    # The same stream each time for that GPU, another for another GPU.
    rt.from_dlpack(p, device="cpu")
    assert p.streams[1] == s
    q = gpu_producer(rt, a, "cuda:1")
    rt.from_dlpack(q, device="cpu")
    assert q.streams[0] not in (s, None)
    del t
    assert eventually(lambda: p.deletes == p.exports)


def test_the_callers_stream_is_passed_on_and_followed(rt):
    a = np.arange(64, dtype=np.int32)
    p = gpu_producer(rt, a)
    t = rt.from_dlpack(p, device="cpu", stream=1)  # the legacy default stream
    assert p.streams == [1]
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    view = rt.from_dlpack(p, stream=1)  # a view that waits for the stream first
    assert view.is_view and view.device == "cuda:0"


def test_host_producers_get_no_stream(rt):
    p = CountingProducer(np.arange(4.0))
    rt.from_dlpack(p, device="cuda:0")
    assert p.streams == [None]


def test_a_stream_for_host_memory_is_refused_before_consumption(rt):
    p = CountingProducer(np.arange(4.0))
    with pytest.raises(ValueError, match="stream") as e:
        rt.from_dlpack(p, stream=5)
    assert e.value.rule == "stream" and not e.value.consumed


def test_the_stream_ambiguity_zero_is_refused(rt):
    p = gpu_producer(rt, np.arange(4.0))
    with pytest.raises(ValueError, match="0") as e:
        rt.from_dlpack(p, stream=0)
    assert not e.value.consumed


# The caller's stream is checked against the producer's __dlpack_device__()
# before its __dlpack__ is called: a producer is never handed a stream that
# the import refuses, and a CUDA producer never gets 0, which DLPack forbids.


def refused_stream(call, *words):
    with pytest.raises(ValueError) as e:
        call()
    assert e.value.rule == "stream" and e.value.consumed is False
    for word in words:
        assert word in str(e.value)


def test_a_stream_for_host_memory_is_refused_before_the_producer_is_called(rt):
    p = CountingProducer(np.arange(4.0))
    refused_stream(lambda: rt.from_dlpack(p, stream=5), "stream 5", "(1, 0)", "host memory has no streams")
    refused_stream(lambda: rt.from_dlpack(p, device="cuda:0", stream=1), "stream 1")

    async def main():
        await rt.import_dlpack(p, stream=5)

    refused_stream(lambda: asyncio.run(main()), "stream 5")

    async def batch():
        await rt.import_batch([p, CountingProducer(np.arange(2.0))], stream=5)

    refused_stream(lambda: asyncio.run(batch()), "stream 5")
    assert p.streams == [] and p.exports == 0


def test_numpy_is_refused_a_stream_by_dlasync_not_by_numpy(rt):
    a = np.arange(4.0)
    refused_stream(lambda: rt.from_dlpack(a, stream=1), "stream 1", "ndarray", "(1, 0)")
    refused_stream(lambda: rt.from_dlpack(a, stream=7), "stream 7")
    # -1 ("no synchronization") means no stream for host memory: NumPy, which
    # takes only stream=None, is asked without one.
    t = rt.from_dlpack(a, stream=-1)
    np.testing.assert_array_equal(np.from_dlpack(t), a)


def test_a_pytorch_cpu_tensor_is_not_exported_for_a_refused_stream(rt):
    torch = pytest.importorskip("torch")
    w = Wrapping(torch.arange(4.0))
    refused_stream(lambda: rt.from_dlpack(w, stream=1), "stream 1", "(1, 0)")
    assert w.exports == 0 and w.deletes == 0
    refused_stream(lambda: rt.from_dlpack(torch.arange(4.0), stream=1), "Tensor", "(1, 0)")
    t = rt.from_dlpack(w, stream=-1)
    assert w.exports == 1
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(4.0))


def test_a_cuda_producer_is_never_sent_stream_0_or_a_malformed_stream(rt):
    p = gpu_producer(rt, np.arange(4.0))
    for bad in (0, -2, 2**64):
        refused_stream(lambda: rt.from_dlpack(p, stream=bad), f"stream {bad}")
    assert p.streams == [] and p.exports == 0
    rt.from_dlpack(p, device="cpu", stream=2)
    assert p.streams == [2]


def test_host_memory_with_stream_minus_1_is_asked_with_no_stream(rt):
    p = CountingProducer(np.arange(4.0))
    rt.from_dlpack(p, stream=-1)
    assert p.streams == [None]


def test_a_stream_for_a_producer_without_dlpack_device_is_refused(rt):
    class NoDevice:
        def __init__(self, inner):
            self.inner = inner

        def __dlpack__(self, **kw):
            return self.inner.__dlpack__(**kw)

    p = CountingProducer(np.arange(4.0))
    refused_stream(lambda: rt.from_dlpack(NoDevice(p), stream=1), "no __dlpack_device__")
    assert p.exports == 0
    rt.from_dlpack(NoDevice(p))  # without a stream it is imported
    assert p.streams == [None]


def test_a_stream_for_a_dlasync_tensor_on_the_host_is_refused(rt):
    t = rt.from_dlpack(np.arange(4.0))
    refused_stream(lambda: rt.from_dlpack(t, stream=1), "dlasync.Tensor on cpu:0")
