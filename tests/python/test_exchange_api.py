"""DLPack 1.3's C exchange API: a producer type that offers
__dlpack_c_exchange_api__ is taken through its table, with no __dlpack__
call, and a GPU tensor follows the producer's current work stream."""
import ctypes
import re

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
    with pytest.raises(ValueError, match="copy") as e:
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


NEW_NAME = "__dlpack_c_exchange_api__"
# Paddle and tvm-ffi 0.1.0 to 0.1.3 offered the table's address as an int
# under this name, before DLPack 1.3 named it.
OLD_NAME = "__c_dlpack_exchange_api__"


def hostile_type(attribute, base=dp.CountingProducer, name=NEW_NAME):
    # Under the old name, the new one is None: the old one is read then.
    fields = {name: attribute} if name == NEW_NAME else {name: attribute, NEW_NAME: None}
    return type("Hostile", (base,), fields)


def assert_refused_and_untouched(rt, producer_type, error, words):
    p = producer_type(np.arange(3.0))
    for _ in range(2):  # the refusal is remembered for the type, and raised each time
        with pytest.raises(error, match=re.escape(words)):
            rt.from_dlpack(p, device="cpu:1")
    assert p.exports == 0 and dp.exchange_calls["from_py"] == 0


@pytest.mark.parametrize("attribute, error, words", [
    (1, ValueError, "the int address is 0x1, inside the first page"),
    (0, ValueError, "the int address is 0x0, NULL"),
    (4096 + 4, ValueError, "the int address is 0x1004, not aligned to 8 bytes"),
    (-8, ValueError, "is the int -8, which is no address"),
    (1 << 70, ValueError, f"is the int {1 << 70}, which is no address"),
    ("4096", TypeError, "is a str; the DLPack C exchange API is a capsule"),
    (True, TypeError, "is a bool"),
])
def test_an_attribute_that_cannot_hold_a_table_is_refused(rt, attribute, error, words):
    assert_refused_and_untouched(rt, hostile_type(attribute), error, words)


def test_capsules_of_another_name_or_a_bad_pointer_are_refused(rt):
    api = dp.exchange_table()
    other = ctypes.create_string_buffer(b"dltensor")
    misnamed = dp.exchange_capsule(ctypes.addressof(api), name=other)
    assert_refused_and_untouched(rt, hostile_type(misnamed), TypeError,
                                 'is a capsule named "dltensor"; the DLPack C exchange API is '
                                 'a capsule named "dlpack_exchange_api"')
    nameless = dp._api.PyCapsule_New(ctypes.addressof(api), None, None)
    assert_refused_and_untouched(rt, hostile_type(nameless), TypeError,
                                 "is a capsule with no name (NULL); the DLPack C exchange API")
    address = ctypes.addressof(api) + 4
    assert_refused_and_untouched(rt, hostile_type(dp.exchange_capsule(address)), ValueError,
                                 f"the capsule's pointer is {address:#x}, not aligned")
    assert_refused_and_untouched(rt, hostile_type(dp.exchange_capsule(16)), ValueError,
                                 "the capsule's pointer is 0x10, inside the first page")


def test_tables_whose_versions_make_no_sense_are_refused(rt):
    def refused(api, words):
        capsule = dp.exchange_capsule(ctypes.addressof(api))
        assert_refused_and_untouched(rt, hostile_type(capsule), ValueError, words)

    refused(dp.exchange_table(major=0), "a table of version 0.3, which has none")
    refused(dp.exchange_table(major=1, minor=2), "a table of version 1.2, which has none")
    refused(dp.exchange_table(major=2, prev=dp.exchange_table(major=3)),
            "prev_api of its version 2.3 table is a version 3.3 table; a chain goes to older")
    loop = dp.exchange_table(major=2)
    loop.header.prev_api = ctypes.addressof(loop)
    refused(loop, "prev_api of its version 2.3 table is a version 2.3 table")
    crooked = dp.exchange_table(major=2)
    crooked.header.prev_api = ctypes.addressof(dp.exchange_table()) + 2
    refused(crooked, "prev_api of its version 2.3 table is 0x")
    chain = None
    for major in range(2, 20):
        chain = dp.exchange_table(major=major, prev=chain)
    refused(chain, "its prev_api chain runs past 16 tables")
    no_stream = dp.exchange_table()
    no_stream.current_work_stream = dp.CURRENT_STREAM()
    refused(no_stream, "its version 1.3 table has current_work_stream NULL")


@pytest.mark.parametrize("name", [NEW_NAME, OLD_NAME])
def test_the_int_form_is_taken_as_the_producers_promise(rt, name):
    api = dp.exchange_table()
    Producer = hostile_type(ctypes.addressof(api), base=dp.exchange_producer_type(api), name=name)
    p = Producer(np.arange(5.0))
    p.dlpack_calls = 0
    t = rt.from_dlpack(p, device="cpu:1")
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(5.0))
    assert dp.exchange_calls["from_py"] == 1 and p.dlpack_calls == 0
    assert eventually(lambda: p.deletes == p.exports == 1)


_FAILS_SILENTLY = dp.FROM_PY(lambda obj, out: -1)
_STREAM_FAILS_SILENTLY = dp.CURRENT_STREAM(lambda device_type, device_id, out: 7)


def test_a_table_function_that_fails_without_an_exception_is_a_buffer_error(rt):
    api = dp.exchange_table()
    api.managed_tensor_from_py_object_no_sync = _FAILS_SILENTLY
    p = dp.exchange_producer_type(api)(np.arange(3.0))
    with pytest.raises(BufferError, match="managed_tensor_from_py_object_no_sync returned -1 "
                                          "and set no Python error"):
        rt.from_dlpack(p)
    api = dp.exchange_table()
    api.current_work_stream = _STREAM_FAILS_SILENTLY
    a = np.arange(4.0)
    g = rt.from_dlpack(a, device="cuda:0")
    p = dp.exchange_producer_type(api)(a, device=(2, 0), data=g.data_ptr)
    with pytest.raises(BufferError, match="current_work_stream returned 7"):
        rt.from_dlpack(p, device="cpu")
    assert eventually(lambda: p.deletes == p.exports == 1)  # given back to its deleter


def test_the_older_attribute_name_is_refused_by_name(rt):
    assert_refused_and_untouched(rt, hostile_type("0x1000", name=OLD_NAME), TypeError,
                                 "__c_dlpack_exchange_api__ of Hostile is a str")
