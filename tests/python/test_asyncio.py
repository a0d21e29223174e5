"""The awaitable forms on asyncio: completions through the loop, concurrency,
cancellation, batches, and interpreter exit with imports in flight."""
import asyncio
import os
import select
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dlasync
from conftest import eventually
from dlpack_producer import CountingProducer


def test_a_thousand_concurrent_imports_each_release_their_producer_once(rt):
    producers = [CountingProducer(np.full(257, i, dtype=np.int64)) for i in range(1000)]

    async def main():
        targets = ["cpu:1", "cuda:0", "cuda:1", None]
        return await asyncio.gather(*[
            rt.import_dlpack(p, device=targets[i % 4]) for i, p in enumerate(producers)])

    tensors = asyncio.run(main())
    for i, t in enumerate(tensors):
        assert t.is_copy == (i % 4 != 3)
        host = t if i % 4 in (0, 3) else rt.from_dlpack(t, device="cpu")
        assert np.from_dlpack(host)[256] == i
    del tensors, host, t
    assert eventually(lambda: all(p.deletes == p.exports == 1 for p in producers))
    assert rt.in_flight == 0


def test_no_thread_is_started_per_import(rt):
    import threading
    a = np.arange(1 << 16, dtype=np.float32)

    async def main():
        before = threading.active_count()
        ts = await asyncio.gather(*[rt.import_dlpack(a, device="cpu:1") for _ in range(200)])
        assert threading.active_count() <= before + 1  # at most the releaser
        return ts

    assert len(asyncio.run(main())) == 200


def test_cancelling_the_task_cancels_an_import_that_waits_for_budget():
    with dlasync.Runtime(cuda="off", host_devices=2, copy_memory_budget=1 << 20) as rt:
        held = rt.from_dlpack(np.zeros(1 << 20, dtype=np.uint8), device="cpu:1")  # the budget
        p = CountingProducer(np.arange(1024, dtype=np.float32))

        async def main():
            task = asyncio.ensure_future(rt.import_dlpack(p, device="cpu:1"))
            await asyncio.sleep(0.05)
            assert not task.done()  # waiting for budget
            assert rt.in_flight == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert eventually(lambda: p.deletes == 1)  # consumed, then released once
        assert eventually(lambda: rt.in_flight == 0)
        del held
        t = rt.from_dlpack(np.ones(4), device="cpu:1")  # the runtime goes on
        assert t.is_copy


def test_wait_for_timeout_cancels_the_import():
    with dlasync.Runtime(cuda="off", host_devices=2, copy_memory_budget=4096) as rt:
        held = rt.from_dlpack(np.zeros(4096, dtype=np.uint8), device="cpu:1")
        p = CountingProducer(np.arange(16, dtype=np.float32))

        async def main():
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(rt.import_dlpack(p, device="cpu:1"), 0.05)

        asyncio.run(main())
        assert eventually(lambda: p.deletes == 1 and rt.in_flight == 0)
        del held


def test_a_result_resolved_before_its_cancellation_is_released_at_once():
    # The budget holds one copy. The first import's result is in its future
    # when its task is cancelled, before the task has resumed: kept while the
    # cancelled task lives, it would hold the budget, and every import after
    # it would wait for good.
    size = 4096
    producers = [CountingProducer(np.full(size, i % 251, dtype=np.uint8)) for i in range(200)]
    # No inline copies: a copy made inside the call is returned at once, and
    # never reaches a future.
    with dlasync.Runtime(cuda="off", host_devices=2, copy_memory_budget=size,
                         inline_copy_bytes=0) as rt:
        async def one(p):
            t = await rt.import_dlpack(p, device="cpu:1")
            return int(np.from_dlpack(t)[0])

        async def main():
            bridge = dlasync._bridge(asyncio.get_running_loop())
            tasks = [asyncio.ensure_future(one(p)) for p in producers]
            await asyncio.sleep(0)  # they start: the first copies, the others wait for budget
            assert select.select([bridge.fd], [], [], 30)[0], "no completion came"
            bridge.drain()  # the first result is in its future; its task has not resumed
            kept = []
            for i, t in enumerate(tasks):
                if i % 10 < 7:
                    t.cancel()
                else:
                    kept.append(t)
            _, pending = await asyncio.wait(kept, timeout=30)  # a hang guard
            assert not pending, f"{len(pending)} imports wait for budget a cancelled one holds"
            return tasks, [t.result() for t in kept]

        tasks, values = asyncio.run(main())
        assert tasks[0].cancelled()  # the task lives on
        assert values == [i % 251 for i in range(200) if i % 10 >= 7]
        assert eventually(lambda: rt.in_flight == 0)
        assert eventually(lambda: all(p.deletes == p.exports for p in producers))
        t = rt.from_dlpack(np.ones(size, dtype=np.uint8), device="cpu:1")  # the whole budget
        assert t.is_copy


def test_refusals_raise_at_the_await_and_leave_the_producer_untouched(rt):
    p = CountingProducer(np.arange(6.0).reshape(2, 3).T)

    async def main():
        with pytest.raises(ValueError, match="copy") as e:
            await rt.import_dlpack(p, copy=False, require_contiguous=True)
        assert e.value.consumed is False and e.value.rule == "copy"
        assert e.value.copy_reasons == "contiguity"

    asyncio.run(main())
    import gc
    gc.collect()
    assert p.exports == 1 and p.deletes == 1  # by its capsule, never taken


def test_batches_complete_together_and_refuse_together(rt):
    good = [CountingProducer(np.arange(i + 1, dtype=np.int32)) for i in range(5)]
    big = CountingProducer(np.zeros(8, dtype=np.float32), version=(2, 0))

    async def main():
        ts = await rt.import_batch(good, device="cuda:0")
        assert [t.shape for t in ts] == [(i + 1,) for i in range(5)]
        with pytest.raises(BufferError, match="version") as e:
            await rt.import_batch([good[0], big, good[1]], device="cpu:1")
        assert e.value.consumed is False
        mixed = await rt.import_batch(good[:2], device="cpu:1", return_exceptions=True)
        assert all(isinstance(t, dlasync.Tensor) for t in mixed)
        return ts

    ts = asyncio.run(main())
    assert eventually(lambda: all(p.deletes == p.exports for p in good))
    back = rt.from_dlpack(ts[4], device="cpu")
    np.testing.assert_array_equal(np.from_dlpack(back), np.arange(5, dtype=np.int32))


def test_a_batch_reports_members_with_return_exceptions():
    with dlasync.Runtime(cuda="off", host_devices=2) as rt:
        async def main():
            ok = np.arange(4.0)
            return await rt.import_batch([ok, ok[::-1]], device="cpu:1",
                                         return_exceptions=True, copy=True)

        out = asyncio.run(main())
        assert [type(t) for t in out] == [dlasync.Tensor, dlasync.Tensor]


def test_imports_from_several_loops_in_threads(rt):
    import threading
    errors = []

    def worker(n):
        try:
            async def main():
                ts = await asyncio.gather(*[
                    rt.import_dlpack(np.full(64, n, dtype=np.int16), device="cpu:1")
                    for _ in range(50)])
                assert all(np.from_dlpack(t)[0] == n for t in ts)
            asyncio.run(main())
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def run_python(code):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(__file__)] + [p for p in sys.path if p])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_interpreter_exit_with_imports_in_flight():
    # The loop is abandoned with imports waiting for budget and running:
    # exit shuts the runtime down, every producer is released once, and the
    # process ends cleanly.
    r = run_python("""
        import asyncio, atexit, numpy as np
        from dlpack_producer import CountingProducer, double_deletes
        producers = []
        def report():
            print("deletes", sum(p.deletes for p in producers), "of",
                  sum(p.exports for p in producers), "double", len(double_deletes))
        atexit.register(report)   # registered first: runs after dlasync's hook
        import dlasync
        rt = dlasync.Runtime(cuda="sim:1", host_devices=2, copy_memory_budget=1 << 20)
        held = rt.from_dlpack(np.zeros(1 << 20, dtype=np.uint8), device="cpu:1")
        async def main():
            for i in range(50):
                p = CountingProducer(np.full(1 << 12, i, dtype=np.float32))
                producers.append(p)
                asyncio.ensure_future(rt.import_dlpack(p, device="cpu:1" if i % 2 else "cuda:0"))
            await asyncio.sleep(0.01)
        loop = asyncio.new_event_loop()
        loop.run_until_complete(main())
        print("in flight", rt.in_flight > 0)
    """)
    assert r.returncode == 0, r.stderr
    assert "in flight True" in r.stdout
    assert "deletes 50 of 50 double 0" in r.stdout, r.stdout + r.stderr


def test_interpreter_exit_with_views_alive():
    r = run_python("""
        import numpy as np, dlasync
        rt = dlasync.Runtime(cuda="sim:1")
        keep = [rt.from_dlpack(np.arange(100.0)) for _ in range(10)]
        gpu = rt.from_dlpack(np.arange(100.0), device="cuda:0")
        print("ok")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.parametrize("inline_copy_bytes", [None, 0])
def test_an_import_that_completes_in_the_call_never_suspends(inline_copy_bytes):
    # A view, and a copy small enough to run inline, are made inside the
    # call: the coroutine returns without a future or a trip through the
    # loop. With inline copies off, the copy's result comes through one.
    with dlasync.Runtime(cuda="off", host_devices=2, inline_copy_bytes=inline_copy_bytes) as rt:
        async def main():
            loop = asyncio.get_running_loop()
            view = CountingProducer(np.arange(16.0))
            copy = CountingProducer(np.arange(16.0))
            got_view = rt._start_import(view, loop)
            got_copy = rt._start_import(copy, loop, device="cpu:1")
            assert isinstance(got_view, dlasync.Tensor) and got_view.is_view
            if inline_copy_bytes is None:
                assert isinstance(got_copy, dlasync.Tensor) and got_copy.is_copy
                assert copy.deletes == 1  # the copy no longer reads it
            else:
                call, future = got_copy
                got_copy = await future
            assert np.from_dlpack(got_copy).tolist() == list(range(16))
            assert view.deletes == 0
            del got_view
            assert eventually(lambda: view.deletes == 1 and copy.deletes == 1)

        asyncio.run(main())


def test_a_loop_that_cannot_watch_the_bridge_leaves_the_producer_as_it_was():
    # The loop's bridge is made before the import takes anything: when the
    # loop refuses it, the import raises and nothing is left in flight.
    class NoReaders(asyncio.SelectorEventLoop):
        def add_reader(self, fd, callback, *args):
            raise NotImplementedError("this loop watches no file descriptors")

    with dlasync.Runtime(cuda="off", host_devices=2, inline_copy_bytes=0) as rt:
        p = CountingProducer(np.arange(16.0))
        capsule = p.__dlpack__(max_version=(1, 3))
        loop = NoReaders()
        try:
            with pytest.raises(NotImplementedError, match="watches no file descriptors"):
                loop.run_until_complete(rt.import_dlpack(capsule, device="cpu:1"))
        finally:
            loop.close()
        assert rt.in_flight == 0 and p.deletes == 0
        # The capsule was not consumed: another import takes it.
        t = rt.from_dlpack(capsule, device="cpu:1")
        assert np.from_dlpack(t).tolist() == list(np.arange(16.0))
        del capsule
        assert eventually(lambda: p.deletes == p.exports == 1)
