"""Arguments of the wrong type are TypeErrors and of the wrong value ValueErrors,
with dlasync's message naming the value seen; one rule for Tensor.__dlpack__
and the importing functions alike. No pybind11 message reaches a user."""
import asyncio
import ctypes
import gc

import numpy as np
import pytest

import dlasync
from dlpack_producer import CountingProducer

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

PYBIND11_WORDS = ("Unable to cast", "error_already_set", "incompatible function arguments",
                  "incompatible constructor arguments")


def raises(kind, call, *words):
    """`call()` raises exactly `kind` (not a subclass of another), with dlasync's
    message: every word of `words` and none of pybind11's."""
    with pytest.raises(Exception) as e:
        call()
    assert type(e.value) is kind, f"{type(e.value).__name__}: {e.value}"
    text = str(e.value)
    for word in words:
        assert word in text, text
    for word in PYBIND11_WORDS:
        assert word not in text, text
    return e.value


def test_dlpack_arguments_of_the_wrong_type_are_type_errors(rt):
    t = rt.from_dlpack(np.arange(4.0))
    raises(TypeError, lambda: t.__dlpack__(stream=object()), "stream", "object")
    raises(TypeError, lambda: t.__dlpack__(stream=1.0), "stream", "1.0 of type float")
    raises(TypeError, lambda: t.__dlpack__(stream=True), "stream", "True of type bool")
    raises(TypeError, lambda: t.__dlpack__(copy=np.array([1, 2, 3])), "copy",
           "array([1, 2, 3])", "True, False or None")
    raises(TypeError, lambda: t.__dlpack__(max_version=(1,)), "max_version", "(1,)")
    raises(TypeError, lambda: t.__dlpack__(max_version=[1, 3]), "max_version", "[1, 3]")
    raises(TypeError, lambda: t.__dlpack__(max_version=(1, "3")), "max_version", "'3'")
    raises(TypeError, lambda: t.__dlpack__(dl_device=(1.0, 0)), "device", "(1.0, 0)")


def test_dlpack_arguments_of_the_wrong_value_are_value_errors(rt):
    t = rt.from_dlpack(np.arange(4.0))
    raises(ValueError, lambda: t.__dlpack__(max_version=(-1, 0)), "max_version", "-1")
    raises(ValueError, lambda: t.__dlpack__(max_version=(2**70, 0)), "max_version",
           str(2**70))
    raises(ValueError, lambda: t.__dlpack__(dl_device=(2**70, 0)), "device type", str(2**70))
    raises(ValueError, lambda: t.__dlpack__(dl_device=(1, -1)), "device id -1")
    g = rt.from_dlpack(np.arange(4.0), device="cuda:0")
    for bad in (0, -2, 2**70):
        raises(ValueError, lambda: g.__dlpack__(stream=bad), "stream", str(bad))
    # A right one still exports.
    assert "dltensor_versioned" in repr(t.__dlpack__(max_version=(1, 3), stream=-1))


def test_copy_takes_a_bool_or_none_on_both_sides(rt):
    # The standard types copy as Optional[bool]: 1, numpy's bool and an array
    # are refused alike by __dlpack__ and by every importing function.
    t = rt.from_dlpack(np.arange(4.0))
    for bad in (1, 0, np.True_, np.array([1, 2, 3]), "yes"):
        raises(TypeError, lambda: t.__dlpack__(copy=bad), "copy", "True, False or None")
        raises(TypeError, lambda: rt.from_dlpack(np.arange(2.0), copy=bad), "copy",
               "True, False or None")

        async def main():
            await rt.import_dlpack(np.arange(2.0), copy=bad)

        raises(TypeError, lambda: asyncio.run(main()), "copy", "True, False or None")
    for flag in ("require_contiguous", "require_writable"):
        raises(TypeError, lambda: rt.from_dlpack(np.arange(2.0), **{flag: 1}), flag,
               "True or False")
    assert rt.from_dlpack(np.arange(2.0), copy=True).is_copy
    assert t.__dlpack__(copy=False) is not None


def test_import_streams_of_the_wrong_type_or_value(rt):
    p = CountingProducer(np.arange(4.0), device=(2, 0))
    raises(TypeError, lambda: rt.from_dlpack(p, stream="s"), "stream", "'s' of type str")
    e = raises(ValueError, lambda: rt.from_dlpack(p, stream=2**70), "stream", str(2**70),
               "64 bits")
    assert e.rule == "stream" and e.consumed is False
    raises(ValueError, lambda: rt.from_dlpack(p, stream=-3), "stream -3")
    assert p.exports == 0  # never asked for its tensor


def test_a_capsule_with_no_name_is_a_type_error(rt):
    nameless = _new_capsule(1, None, None)
    raises(TypeError, lambda: rt.from_dlpack(nameless), "no name", "dltensor")

    class Producer(CountingProducer):
        def __dlpack__(self, **kw):
            return _new_capsule(1, None, None)

    raises(TypeError, lambda: rt.from_dlpack(Producer(np.arange(2.0))), "no name")


def test_runtime_options_of_the_wrong_type_or_value():
    raises(TypeError, lambda: dlasync.Runtime(cuda=5), "cuda", "5 of type int")
    raises(TypeError, lambda: dlasync.Runtime(cuda="off", workers="x"), "workers", "'x'")
    raises(TypeError, lambda: dlasync.Runtime(cuda="off", inline_copy_bytes=1.5),
           "inline_copy_bytes", "1.5")
    raises(ValueError, lambda: dlasync.Runtime(cuda="off", copy_memory_budget=-1),
           "copy_memory_budget=-1")
    raises(ValueError, lambda: dlasync.Runtime(cuda="off", copy_helper_linger_us=2**70),
           "copy_helper_linger_us", str(2**70))
    raises(ValueError, lambda: dlasync.Runtime(cuda="off", staging_chunks=2**40),
           "staging_chunks")
    raises(TypeError, lambda: dlasync.Device("cpu", "0"), "'0'")
    gc.collect()


def test_from_dlpack_takes_the_arguments_it_names_and_refuses_others(rt):
    # A vectorcall method, not a pybind11 binding: the same signature and
    # the standard's TypeErrors, naming what was wrong.
    import inspect
    a = np.arange(4.0)
    sig = inspect.signature(type(rt).from_dlpack)
    assert list(sig.parameters) == ["self", "x", "device", "copy", "stream",
                                    "require_contiguous", "require_writable"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'dtype'"):
        rt.from_dlpack(a, dtype="float32")
    with pytest.raises(TypeError, match="takes 1 positional argument.*2 given"):
        rt.from_dlpack(a, "cpu")
    with pytest.raises(TypeError, match="0 given"):
        rt.from_dlpack()
    with pytest.raises(TypeError, match="copy"):
        rt.from_dlpack(a, copy=1)
    t = rt.from_dlpack(a, device="cpu:1", copy=True, stream=None, require_contiguous=True,
                       require_writable=True)
    assert t.is_copy and t.device == "cpu:1"
    # Unbound, through the type, as pybind11's binding allowed.
    assert type(rt).from_dlpack(rt, a).is_view


def test_from_dlpack_on_a_runtime_that_was_never_initialized():
    r = dlasync.Runtime.__new__(dlasync.Runtime)
    with pytest.raises(TypeError, match="not initialized"):
        r.from_dlpack(np.arange(2.0))


def test_tensor_methods_called_on_another_object_are_type_errors(rt):
    # Tensor's methods and properties read the object they are given as a
    # Tensor only after checking that it is one.
    a = np.arange(3.0)
    t = rt.from_dlpack(a)
    for name in ["shape", "strides", "dtype", "device", "nbytes", "data_ptr", "is_view"]:
        getter = getattr(dlasync.Tensor, name).fget
        assert getter(t) == getattr(t, name)
        with pytest.raises(TypeError, match="expected a dlasync.Tensor, not ndarray"):
            getter(a)
    for name in ["__dlpack__", "__dlpack_device__", "__repr__"]:
        with pytest.raises(TypeError, match="expected a dlasync.Tensor, not ndarray"):
            getattr(dlasync.Tensor, name)(a)
    empty = dlasync.Tensor.__new__(dlasync.Tensor)
    with pytest.raises(TypeError, match="holds no tensor"):
        empty.shape
    with pytest.raises(TypeError, match="holds no tensor"):
        repr(empty)
    del empty
    gc.collect()
    assert t.shape == (3,) and t.data_ptr == a.ctypes.data


def test_a_tensor_freed_while_an_exception_is_raised_keeps_the_exception(rt):
    # The temporary Tensor goes while AttributeError is being raised; its
    # producer's deleter (Python code here, through ctypes) must neither see
    # that exception nor lose it.
    p = CountingProducer(np.arange(4.0))
    with pytest.raises(AttributeError, match="nope"):
        rt.from_dlpack(p).nope
    assert p.deletes == 1
    # The same for a capsule that goes unclaimed while an exception is raised.
    t = rt.from_dlpack(np.arange(4.0))
    with pytest.raises(AttributeError, match="nope"):
        t.__dlpack__().nope


def test_tensors_take_weak_references_and_have_no_constructor(rt):
    import weakref
    t = rt.from_dlpack(np.arange(4.0))
    ref = weakref.ref(t)
    assert ref() is t
    del t
    gc.collect()
    assert ref() is None
    with pytest.raises(TypeError, match="no constructor"):
        dlasync.Tensor()
    with pytest.raises(TypeError, match="no constructor"):
        dlasync.Tensor(1, 2)


def test_a_producer_whose_dlpack_getter_fails_keeps_its_own_error(rt):
    class Broken:
        def __dlpack_device__(self):
            return (1, 0)

        @property
        def __dlpack__(self):
            raise KeyError("the getter failed")

    class Missing:
        def __dlpack_device__(self):
            return (1, 0)

    class Unset(Missing):
        __dlpack__ = None

    with pytest.raises(KeyError, match="the getter failed"):
        rt.from_dlpack(Broken())
    for producer in (Missing(), Unset()):
        with pytest.raises(AttributeError, match="has no __dlpack__"):
            rt.from_dlpack(producer)
