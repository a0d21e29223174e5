"""The stream protocol, on simulated GPUs: for a CUDA producer dlasync passes
the stream it will follow as `__dlpack__(stream=...)`; the caller may name one
instead. Host producers get no stream."""
import numpy as np
import pytest

import dlasync
from conftest import eventually
from dlpack_producer import CountingProducer


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
