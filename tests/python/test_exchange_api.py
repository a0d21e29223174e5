"""DLPack 1.3's C exchange API: a producer type that offers
__dlpack_c_exchange_api__ is taken through its table, with no __dlpack__
call, and a GPU tensor follows the producer's current work stream."""
import numpy as np
import pytest

import dlpack_producer as dp
from conftest import eventually


@pytest.fixture(autouse=True)
def reset_calls():
    dp.exchange_calls["from_py"] = 0
    dp.exchange_calls["streams"].clear()


def test_host_tensors_come_through_the_table(rt):
    Producer = dp.exchange_producer_type(dp.exchange_table())
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = Producer(a)
    p.dlpack_calls = 0
    t = rt.from_dlpack(p)
    assert t.is_view and t.data_ptr == a.ctypes.data
    c = rt.from_dlpack(p, device="cpu:1")
    np.testing.assert_array_equal(np.from_dlpack(c), a)
    assert dp.exchange_calls["from_py"] == 2 and p.dlpack_calls == 0
    assert dp.exchange_calls["streams"] == []  # host memory has no stream
    del t
    assert eventually(lambda: p.deletes == p.exports == 2)


def test_gpu_tensors_follow_the_producers_current_stream(rt):
    Producer = dp.exchange_producer_type(dp.exchange_table())
    a = np.arange(256, dtype=np.int32)
    g = rt.from_dlpack(a, device="cuda:1")
    p = Producer(a, device=(2, 1), data=g.data_ptr)
    p.dlpack_calls = 0
    back = rt.from_dlpack(p, device="cpu")
    np.testing.assert_array_equal(np.from_dlpack(back), a)
    assert dp.exchange_calls["streams"] == [(2, 1)]
    assert p.dlpack_calls == 0


def test_a_refused_tensor_goes_back_to_the_producers_deleter(rt):
    Producer = dp.exchange_producer_type(dp.exchange_table())
    p = Producer(np.arange(4.0).reshape(2, 2).T)
    with pytest.raises(BufferError, match="copy") as e:
        rt.from_dlpack(p, copy=False, require_contiguous=True)
    assert not e.value.consumed
    assert p.exports == 1 and p.deletes == 1  # nothing else holds it: deleted once


def test_a_newer_table_chaining_version_1_is_used(rt):
    v1 = dp.exchange_table()
    Producer = dp.exchange_producer_type(dp.exchange_table(major=2, prev=v1))
    p = Producer(np.arange(3.0))
    p.dlpack_calls = 0
    rt.from_dlpack(p, device="cpu:1")
    assert dp.exchange_calls["from_py"] == 1 and p.dlpack_calls == 0


def test_a_table_of_an_unknown_major_falls_back_to_dlpack(rt):
    Producer = dp.exchange_producer_type(dp.exchange_table(major=2))
    p = Producer(np.arange(3.0))
    p.dlpack_calls = 0
    rt.from_dlpack(p, device="cpu:1")
    assert dp.exchange_calls["from_py"] == 0 and p.dlpack_calls == 1


def test_a_caller_stream_takes_the_protocol_path(rt):
    Producer = dp.exchange_producer_type(dp.exchange_table())
    a = np.arange(8, dtype=np.float32)
    g = rt.from_dlpack(a, device="cuda:0")
    p = Producer(a, device=(2, 0), data=g.data_ptr)
    p.dlpack_calls = 0
    rt.from_dlpack(p, device="cpu", stream=1)
    assert p.dlpack_calls == 1 and p.streams[-1] == 1
    assert dp.exchange_calls["from_py"] == 0
