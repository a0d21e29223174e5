"""A DLPack capsule is taken once in the process: a batch that names one
twice, a __dlpack__ that hands out one capsule each call, a producer that
imports an earlier member's capsule from its __dlpack__, and threads that
race for one capsule all end with one owner and one deleter call."""
import asyncio
import ctypes
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import dlpack_producer as dp
from conftest import eventually
from dlpack_producer import CountingProducer, Wrapping


def capsule_name(capsule):
    return dp._api.PyCapsule_GetName(capsule)


class OneCapsule:
    """A producer whose __dlpack__ returns the same capsule on every call."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kw):
        return self.capsule


def test_a_capsule_twice_in_a_batch_is_refused_and_deleted_once(rt):
    w = Wrapping(np.arange(8.0))  # NumPy's capsule, its deleter counted
    cap = w.__dlpack__()

    async def main():
        with pytest.raises(BufferError, match="batch member 1 is the DLPack capsule of member 0"):
            await rt.import_batch([cap, cap], device="cpu:1")

    asyncio.run(main())
    assert capsule_name(cap) == b"dltensor"  # refused: still the producer's
    t = rt.from_dlpack(cap, device="cpu:1")  # and importable once
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(8.0))
    assert capsule_name(cap) == b"used_dltensor"
    cap = None
    assert eventually(lambda: w.deletes == 1)


def test_a_dlpack_that_returns_one_capsule_each_call_is_refused_in_a_batch(rt):
    p = CountingProducer(np.arange(6, dtype=np.int32))
    x = OneCapsule(p.__dlpack__(max_version=(1, 3)))

    async def main():
        with pytest.raises(BufferError, match="member 2 is the DLPack capsule of member 1"):
            await rt.import_batch([np.ones(3), x, x], device="cpu:1")
        return await rt.import_batch([x], device="cpu:1")

    [t] = asyncio.run(main())
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(6, dtype=np.int32))
    assert eventually(lambda: p.exports == p.deletes == 1)


def test_two_capsules_of_one_tensor_are_refused_in_a_batch(rt):
    p = CountingProducer(np.arange(4.0), versioned=False)
    first = p.__dlpack__()
    addr = dp._api.PyCapsule_GetPointer(first, ctypes.cast(dp._NAMES[False], ctypes.c_char_p))
    # A second capsule of the same DLManagedTensor, without a destructor.
    second = dp._api.PyCapsule_New(addr, ctypes.cast(dp._NAMES[False], ctypes.c_char_p), None)

    async def main():
        with pytest.raises(BufferError, match=r"member 1's capsule holds the DLPack tensor of "
                                              r"member 0 \(DLManagedTensor at "):
            await rt.import_batch([first, second], device="cpu:1")

    asyncio.run(main())
    assert capsule_name(first) == capsule_name(second) == b"dltensor"
    dp._api.PyCapsule_SetName(second, ctypes.cast(dp._USED[False], ctypes.c_char_p))
    first = second = None
    assert p.deletes == 1


def test_a_member_that_imports_an_earlier_members_capsule_finds_it_taken(rt):
    w = Wrapping(np.arange(5.0))
    cap = w.__dlpack__()
    seen = []

    class Importer(CountingProducer):
        def __dlpack__(self, **kw):
            try:
                rt.from_dlpack(cap, device="cpu:1")
                seen.append("imported")
            except BufferError as e:
                seen.append(str(e))
            return CountingProducer.__dlpack__(self, **kw)

    other = Importer(np.arange(3.0))

    async def main():
        return await rt.import_batch([cap, other], device="cpu:1")

    a, b = asyncio.run(main())
    assert len(seen) == 1 and "consumed already, or is being imported" in seen[0]
    np.testing.assert_array_equal(np.from_dlpack(a), np.arange(5.0))
    np.testing.assert_array_equal(np.from_dlpack(b), np.arange(3.0))
    a = b = cap = None
    assert eventually(lambda: w.deletes == 1 and other.deletes == other.exports == 1)


def test_numpys_own_capsule_twice_in_a_batch_is_deleted_once():
    # NumPy's deleter run twice is a double free: in a process of its own.
    code = """
        import asyncio, numpy as np, dlasync
        rt = dlasync.Runtime(cuda="off", host_devices=2)
        for _ in range(50):
            cap = np.arange(1000.0).__dlpack__()
            async def main():
                try:
                    await rt.import_batch([cap, cap], device="cpu:1")
                except BufferError as e:
                    return str(e)
            assert "member 1 is the DLPack capsule of member 0" in asyncio.run(main())
            assert repr(cap).startswith('<capsule object "dltensor"'), repr(cap)
            t = rt.from_dlpack(cap, device="cpu:1")  # taken once: the copy
            assert repr(cap).startswith('<capsule object "used_dltensor"'), repr(cap)
            del cap, t
        print("ok")
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stdout, r.stderr)


def test_threads_racing_for_one_capsule_leave_one_owner(rt):
    # Copies of more than 1 MiB give the GIL up while they start: a claim not
    # made before that would let another thread take the capsule too.
    array = np.arange((1 << 17) + 512, dtype=np.float64)
    barrier = threading.Barrier(4, timeout=60)  # a hang guard
    rounds = 200
    outcomes = [[] for _ in range(rounds)]
    wrappers = []

    def racer():
        for r in range(rounds):
            barrier.wait()  # the four start round r together
            try:
                t = rt.from_dlpack(capsules[r], device="cpu:1")
                outcomes[r].append(("ok", np.from_dlpack(t)[-1]))
                del t
            except BufferError as e:
                outcomes[r].append(("refused", str(e)))
            except Exception as e:  # noqa: BLE001 (reported below, the other threads go on)
                outcomes[r].append(("error", repr(e)))
            barrier.wait()  # every thread is done with round r

    capsules = [None] * rounds
    for r in range(rounds):
        w = Wrapping(array)
        wrappers.append(w)
        capsules[r] = w.__dlpack__()
    threads = [threading.Thread(target=racer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r, got in enumerate(outcomes):
        assert len(got) == 4, f"round {r}: {got}"
        ok = [o for o in got if o[0] == "ok"]
        assert len(ok) == 1, f"round {r}: {len(ok)} threads took the capsule"
        assert ok[0][1] == array[-1]
        assert all(o[0] != "error" and "consumed already" in o[1] for o in got if o[0] != "ok")
    capsules = None
    assert eventually(lambda: all(w.deletes == 1 for w in wrappers))
