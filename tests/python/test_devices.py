"""What a runtime serves: `devices` (every device this process addresses, where
a tensor can be imported from) and `targets` (where an import can place one)."""
import numpy as np
import pytest

import dlasync


def test_targets_are_the_devices_an_import_can_place_a_tensor_on(rt):
    assert rt.targets == ["cpu:0", "cpu:1", "cuda:0", "cuda:1", "cuda_host:0"]
    assert all(isinstance(d, dlasync.Device) for d in rt.targets)
    for d in rt.targets:
        t = rt.from_dlpack(np.arange(4.0), device=d, copy=True)
        assert t.device == d and t.is_copy


def test_devices_that_are_no_targets_refuse_an_import(rt):
    # Managed memory is read where it is; dlasync never allocates there, so
    # a copy cannot land there.
    others = [d for d in rt.devices if d not in rt.targets]
    assert others == ["cuda_managed:0", "cuda_managed:1"]
    for d in others:
        with pytest.raises(BufferError, match="cannot place copies") as e:
            rt.from_dlpack(np.arange(4.0), device=d, copy=True)
        assert e.value.rule == "placement"


def test_a_host_only_runtime_targets_its_host_devices():
    with dlasync.Runtime(cuda="off", host_devices=3) as rt:
        assert rt.targets == ["cpu:0", "cpu:1", "cpu:2"]
        assert "cuda_host:0" in rt.devices


def test_pageable_memory_onto_cuda_host_is_copied_into_page_locked_memory(rt):
    # DLPack's kDLCUDAHost promises locked pages: a NumPy array (pageable)
    # is copied, never handed out as a view labelled pinned.
    x = np.arange(4096, dtype=np.float32)
    t = rt.from_dlpack(x, device="cuda_host:0")
    assert t.__dlpack_device__() == (3, 0)
    assert t.is_copy and not t.is_view
    np.testing.assert_array_equal(np.from_dlpack(rt.from_dlpack(t, device="cpu:0")), x)
    with pytest.raises(ValueError, match="page-locked target") as e:
        rt.from_dlpack(x, device="cuda_host:0", copy=False)
    assert e.value.rule == "copy"
