import gc
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import dlasync  # noqa: E402
import dlpack_producer  # noqa: E402


@pytest.fixture
def rt():
    """Two host devices and two simulated GPUs, with the simulation's checks on."""
    with dlasync.Runtime(cuda="sim:2", host_devices=2, workers=2) as r:
        yield r
    gc.collect()


@pytest.fixture(autouse=True)
def no_double_deletes():
    yield
    assert dlpack_producer.double_deletes == []
