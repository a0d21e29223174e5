"""Errors: the standard's exception types, dlasync's messages, and the
import's facts as attributes. A refused object is left untouched."""
import asyncio
import gc

import numpy as np
import pytest

import dlasync
from dlpack_producer import CountingProducer


def test_objects_without_dlpack_raise_attribute_error(rt):
    with pytest.raises(AttributeError, match="list has no __dlpack__"):
        rt.from_dlpack([1, 2, 3])


def test_devices_are_parsed_strictly(rt):
    a = np.arange(3.0)
    with pytest.raises(ValueError, match="not a device dlasync knows"):
        rt.from_dlpack(a, device="gpu:0")
    with pytest.raises(ValueError, match="ordinal"):
        rt.from_dlpack(a, device="cuda:x")
    with pytest.raises(ValueError, match="device type 99"):
        rt.from_dlpack(a, device=(99, 0))
    with pytest.raises(TypeError, match="1.5 of type float"):
        rt.from_dlpack(a, device=1.5)
    assert dlasync.Device("cuda:1") == (2, 1) == dlasync.Device(2, 1)
    assert str(dlasync.Device((13, 0))) == "cuda_managed:0"
    assert len({dlasync.Device("cpu"), dlasync.Device("cpu:0")}) == 1


def test_a_device_this_process_does_not_serve_is_a_buffer_error(rt):
    p = CountingProducer(np.arange(4.0))
    with pytest.raises(BufferError, match="cuda:7") as e:
        rt.from_dlpack(p, device="cuda:7")
    assert e.value.consumed is False and e.value.rule == "target_device"
    assert e.value.code == "NOT_FOUND" or e.value.code == "FAILED_PRECONDITION"
    gc.collect()
    assert p.deletes == 1  # by its own capsule


def test_copy_false_when_a_copy_is_needed_is_a_value_error(rt):
    # The array API standard's from_dlpack: "ValueError: If data exchange is
    # possible via an explicit copy but copy is set to False."
    p = CountingProducer(np.arange(4.0))
    with pytest.raises(ValueError, match="cross-device") as e:
        rt.from_dlpack(p, device="cpu:1", copy=False)
    assert not isinstance(e.value, BufferError)
    assert e.value.rule == "copy" and e.value.copy_reasons == "cross_device"
    assert e.value.consumed is False
    with pytest.raises(ValueError, match="contiguity"):
        rt.from_dlpack(np.arange(6.0).reshape(2, 3).T, copy=False, require_contiguous=True)

    async def main():
        with pytest.raises(ValueError, match="cross-device"):
            await rt.import_dlpack(p, device="cuda:0", copy=False)
        with pytest.raises(ValueError, match="cross-device"):
            await rt.import_batch([p, np.arange(2.0)], device="cuda:0", copy=False)

    asyncio.run(main())
    assert rt.from_dlpack(p, device="cpu:1").is_copy  # allowed to copy, it does
    gc.collect()
    assert p.deletes == p.exports


def test_a_newer_major_version_is_refused_without_reading_past_it(rt):
    p = CountingProducer(np.arange(4.0), version=(2, 0))
    with pytest.raises(BufferError, match="version") as e:
        rt.from_dlpack(p)
    assert e.value.rule == "version" and not e.value.consumed


def test_wrong_dtypes_and_shapes_are_buffer_errors(rt):
    with pytest.raises(BufferError, match="lanes"):
        rt.from_dlpack(CountingProducer(np.arange(4.0), dtype=(2, 32, 4)))
    with pytest.raises(BufferError, match="opaque_handle"):
        rt.from_dlpack(CountingProducer(np.arange(4.0), dtype=(3, 64, 1)))
    with pytest.raises(BufferError, match="-3") as e:
        rt.from_dlpack(CountingProducer(np.empty((2, 3)), shape=(2, -3)))
    assert e.value.rule == "shape"
    with pytest.raises(BufferError, match="NULL"):
        rt.from_dlpack(CountingProducer(np.empty((2, 2)), data=0))


def test_a_copy_larger_than_the_whole_budget_is_a_memory_error():
    with dlasync.Runtime(cuda="off", host_devices=2, copy_memory_budget=1024) as rt:
        p = CountingProducer(np.zeros(4096, dtype=np.uint8))
        with pytest.raises(MemoryError, match="budget") as e:
            rt.from_dlpack(p, device="cpu:1")
        assert e.value.rule == "budget" and not e.value.consumed


def test_runtime_options_out_of_range_are_value_errors():
    with pytest.raises(ValueError, match="copy_helper_linger is 20000 microseconds"):
        dlasync.Runtime(cuda="off", copy_helper_linger_us=20000)
    # 0 turns lingering off; imports of 1 MiB and more still split and copy.
    with dlasync.Runtime(cuda="off", host_devices=2, workers=2, copy_helper_linger_us=0) as rt:
        x = np.arange(1 << 19, dtype=np.float32).reshape(1024, 512)[:, ::2]
        t = rt.from_dlpack(x, device="cpu:1", copy=True)
        assert np.array_equal(np.from_dlpack(t), x)


def test_imports_after_shutdown_are_runtime_errors():
    rt = dlasync.Runtime(cuda="off")
    rt.shutdown()
    rt.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="shut") as e:
        rt.from_dlpack(np.arange(3.0))
    assert e.value.code == "UNAVAILABLE" and e.value.rule == "shutdown"


def test_capsules(rt):
    cap = np.arange(3.0).__dlpack__()
    rt.from_dlpack(cap)
    with pytest.raises(BufferError, match="consumed already"):
        rt.from_dlpack(cap)
    import ctypes
    ctypes.pythonapi.PyCapsule_New.restype = ctypes.py_object
    ctypes.pythonapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    other = ctypes.pythonapi.PyCapsule_New(1, b"not_a_tensor", None)
    with pytest.raises(TypeError, match="not_a_tensor"):
        rt.from_dlpack(other)


def test_stream_arguments(rt):
    with pytest.raises(TypeError, match="stream takes an int"):
        rt.from_dlpack(np.arange(3.0), stream="s")
    t = rt.from_dlpack(np.arange(3.0))
    with pytest.raises(ValueError, match="host memory has no streams"):
        t.__dlpack__(stream=5)
    t.__dlpack__(stream=None)
    t.__dlpack__(stream=-1)


def test_export_to_another_device_or_as_a_copy(rt):
    a = np.arange(6.0)
    t = rt.from_dlpack(a)
    with pytest.raises(BufferError, match="copy=False"):
        t.__dlpack__(dl_device=(1, 1), copy=False)
    c = rt.from_dlpack(t.__dlpack__(max_version=(1, 3), copy=True))
    assert c.data_ptr != t.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(c), a)
    moved = rt.from_dlpack(t.__dlpack__(max_version=(1, 3), dl_device=(1, 1)))
    assert moved.device == "cpu:1"


def test_a_malformed_dlpack_device_is_a_type_error(rt):
    class Odd(CountingProducer):
        def __dlpack_device__(self):
            return ("cuda", 0)

    p = Odd(np.arange(3.0))
    with pytest.raises(TypeError, match=r"\('cuda', 0\)"):
        rt.from_dlpack(p)
    assert p.exports == 0  # never asked for its tensor


def test_an_empty_batch_is_an_empty_list(rt):
    async def main():
        return await rt.import_batch([])

    assert asyncio.run(main()) == []
