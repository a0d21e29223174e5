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


def peer(name):
    """Imports a peer library: skips without it, except in the PyPI peers'
    environment (DLASYNC_PEERS=required), where a missing peer fails."""
    import importlib
    if os.environ.get("DLASYNC_PEERS") == "required":
        return importlib.import_module(name)
    return pytest.importorskip(name)


def eventually(predicate, seconds=10.0):
    """True once `predicate()` is; deleters that arrive on a thread without the
    GIL run a moment later on dlasync's releaser, which needs the GIL this
    thread gives up while it sleeps."""
    import time
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True
