"""Deleters, references and memory: nothing lost, nothing kept."""
import gc
import sys
import threading
import tracemalloc
import weakref

import numpy as np

import dlasync
from conftest import eventually
from dlpack_producer import CountingProducer


def test_views_hold_the_array_and_release_it_with_the_last_reference(rt):
    a = np.arange(100.0)
    base = sys.getrefcount(a)
    t = rt.from_dlpack(a)
    n = np.from_dlpack(t)
    assert sys.getrefcount(a) == base + 1
    del t
    assert sys.getrefcount(a) == base + 1  # NumPy's array still reads it
    del n
    assert sys.getrefcount(a) == base


def test_no_reference_cycles(rt):
    gc.collect()
    gc.disable()
    try:
        a = np.arange(10.0)
        t = rt.from_dlpack(a, device="cpu:1")
        ref = weakref.ref(a)
        c = rt.from_dlpack(a)
        del a, c
        assert ref() is None  # freed by reference counting alone
        del t
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_repeated_imports_do_not_grow_memory(rt):
    a = np.arange(4096, dtype=np.float32)

    def round_trip():
        for _ in range(200):
            v = rt.from_dlpack(a)
            c = rt.from_dlpack(a, device="cpu:1")
            np.from_dlpack(c)
            del v, c

    round_trip()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    round_trip()
    round_trip()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert grown < 64 * 1024, grown


def test_a_slow_python_deleter_does_not_stall_the_runtime():
    # A producer's deleter that blocks holds dlasync's releaser, never a
    # worker: other imports, copies included, complete meanwhile.
    with dlasync.Runtime(cuda="sim:1", host_devices=2, workers=1) as rt:
        gate = threading.Event()
        entered = threading.Event()
        slow = CountingProducer(np.arange(1 << 16, dtype=np.float32))
        orig = slow.__dlpack__

        def dlpack_with_blocking_delete(**kw):
            cap = orig(**kw)
            return cap
        slow.__dlpack__ = dlpack_with_blocking_delete

        import dlpack_producer
        real_on_delete = dlpack_producer._on_delete

        def blocking(addr):
            entered.set()
            gate.wait(10)  # sleeps with the GIL released
            real_on_delete(addr)

        blocked_deleter = dlpack_producer.DELETER(blocking)
        cap = slow.__dlpack__(max_version=(1, 3))
        m = dlpack_producer.DLManagedTensorVersioned.from_address(
            dlpack_producer._api.PyCapsule_GetPointer(
                cap, dlpack_producer.ctypes.cast(dlpack_producer._NAMES[True],
                                                 dlpack_producer.c_char_p)))
        m.deleter = blocked_deleter
        first = rt.from_dlpack(cap, device="cpu:1")  # its deleter runs on the releaser
        assert first.is_copy
        assert entered.wait(10)
        others = [rt.from_dlpack(np.full(1 << 16, i, np.float32), device=d)
                  for i, d in enumerate(["cpu:1", "cuda:0"] * 5)]
        assert len(others) == 10 and not gate.is_set()
        gate.set()
        assert eventually(lambda: slow.deletes == 1)


def test_tensors_outlive_their_runtime_shutdown():
    rt = dlasync.Runtime(cuda="sim:1", host_devices=2)
    a = np.arange(12.0)
    v = rt.from_dlpack(a)
    c = rt.from_dlpack(a, device="cpu:1")
    g = rt.from_dlpack(a, device="cuda:0")
    rt.shutdown()
    assert rt.closed
    np.testing.assert_array_equal(np.from_dlpack(v), a)
    np.testing.assert_array_equal(np.from_dlpack(c), a)
    del v, c, g, rt
    gc.collect()


def test_the_runtime_is_released_when_its_last_tensor_goes():
    rt = dlasync.Runtime(cuda="off")
    ref = weakref.ref(rt)
    t = rt.from_dlpack(np.arange(3.0))
    del rt
    assert ref() is not None  # the tensor keeps it
    del t
    assert ref() is None


def test_ctrl_c_interrupts_a_synchronous_wait_and_the_import_still_releases_its_source():
    from test_asyncio import run_python
    r = run_python("""
        import os, signal, threading, time, numpy as np, dlasync
        from dlpack_producer import CountingProducer
        rt = dlasync.Runtime(cuda="off", host_devices=2, copy_memory_budget=1 << 20)
        held = rt.from_dlpack(np.zeros(1 << 20, dtype=np.uint8), device="cpu:1")
        p = CountingProducer(np.arange(1024, dtype=np.float32))
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            rt.from_dlpack(p, device="cpu:1")   # waits for budget
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted after", round(time.monotonic() - t0, 1), "s")
        print("deletes before", p.deletes)
        del held                              # the abandoned import goes on
        deadline = time.monotonic() + 10
        while p.deletes == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        print("deletes after", p.deletes, "in flight", rt.in_flight)
    """)
    assert r.returncode == 0, r.stderr
    assert "interrupted after" in r.stdout, r.stdout
    seconds = float(r.stdout.split("interrupted after ")[1].split(" s")[0])
    assert seconds < 1.0
    assert "deletes before 0" in r.stdout
    assert "deletes after 1 in flight 0" in r.stdout, r.stdout
