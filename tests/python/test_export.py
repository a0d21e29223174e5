"""Tensor.__dlpack__ as a producer: a copy made for the consumer says so with
DLPack's IS_COPIED flag, as the array API standard requires ("When a copy
happens, the DLPACK_FLAG_BITMASK_IS_COPIED flag must be set")."""
import ctypes

import numpy as np

import dlpack_producer as dp

_versioned = ctypes.create_string_buffer(b"dltensor_versioned")


def flags_of(capsule):
    """The flags of the versioned tensor a capsule holds, read in place."""
    addr = dp._api.PyCapsule_GetPointer(capsule, ctypes.cast(_versioned, ctypes.c_char_p))
    return dp.DLManagedTensorVersioned.from_address(addr).flags


def test_a_copy_made_for_the_consumer_is_flagged_is_copied(rt):
    t = rt.from_dlpack(np.arange(6.0))
    assert flags_of(t.__dlpack__(max_version=(1, 3), copy=True)) & dp.IS_COPIED
    assert flags_of(t.__dlpack__(max_version=(1, 3), dl_device=(1, 0), copy=True)) & dp.IS_COPIED
    # Another device needs a copy even when copy=None: flagged as well.
    assert flags_of(t.__dlpack__(max_version=(1, 3), dl_device=(1, 1))) & dp.IS_COPIED
    g = rt.from_dlpack(np.arange(6.0), device="cuda:0")
    assert flags_of(g.__dlpack__(max_version=(1, 3), dl_device=(1, 0))) & dp.IS_COPIED


def test_a_view_is_not_flagged_is_copied(rt):
    t = rt.from_dlpack(np.arange(6.0))
    assert flags_of(t.__dlpack__(max_version=(1, 3))) & dp.IS_COPIED == 0
    assert flags_of(t.__dlpack__(max_version=(1, 3), dl_device=(1, 0))) & dp.IS_COPIED == 0
    c = rt.from_dlpack(t, copy=True)  # dlasync's copy, shared as it is
    assert flags_of(c.__dlpack__(max_version=(1, 3), copy=False)) & dp.IS_COPIED == 0


def test_a_consumer_asking_for_a_copy_takes_the_flagged_copy_as_it_is(rt):
    # A consumer that needs its own copy needs no second one when the
    # producer says it made one: dlasync itself takes it as a view.
    a = np.arange(6.0)
    t = rt.from_dlpack(a)
    c = rt.from_dlpack(t.__dlpack__(max_version=(1, 3), copy=True), copy=True)
    assert c.is_view and c.data_ptr != t.data_ptr
    np.testing.assert_array_equal(np.from_dlpack(c), a)
