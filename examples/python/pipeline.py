#!/usr/bin/env python3
"""dlasync's asynchronous data pipeline, in Python.

    producers --[queue]--> importers --[queue]--> checkers

asyncio producers make float32 NumPy batches, contiguous (pageable) and strided (a
transposed view, or every other row), each made on a thread so that the loop keeps
running. A bounded number of importer tasks `await rt.import_dlpack(...)` them onto the
target device: several imports are in flight at once and no thread waits for one.
Checkers hand each result to PyTorch through `torch.from_dlpack` and compare every
element with what the producer made (a tensor on a simulated GPU is brought back to the
host first: PyTorch cannot read simulated device memory). The queues are bounded, so a
slow stage holds the ones before it back.

It ends with the same summary table as the C++ pipeline (examples/pipeline); the exit
status is 0 only when every batch arrived intact.

    python3 examples/python/pipeline.py --seconds 5              # the first GPU, else the host
    python3 examples/python/pipeline.py --sim-gpus 1 --seconds 5  # simulated GPUs, named so
"""
import argparse
import asyncio
import sys
import time

import numpy as np

import dlasync

KINDS = ("pageable", "strided")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto",
                   help="auto (the first GPU when there is one, else the host), cpu, or cuda:N")
    p.add_argument("--sim-gpus", type=int, default=0,
                   help="use this many simulated GPUs instead of real ones (no GPU needed)")
    p.add_argument("--seconds", type=float, default=10.0, help="how long the producers run")
    p.add_argument("--items", type=int, default=0, help="stop after this many batches (0: --seconds)")
    p.add_argument("--batch-mib", type=float, default=1.0, help="size of a batch in MiB")
    p.add_argument("--mix", default="pageable,strided", help="kinds of batches, taken in turn")
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4, help="imports in flight at most")
    p.add_argument("--checkers", type=int, default=2)
    p.add_argument("--queue-depth", type=int, default=4)
    args = p.parse_args(argv)
    mix = args.mix.split(",")
    bad = [k for k in mix if k not in KINDS]
    if bad or args.batch_mib <= 0 or min(args.producers, args.concurrency, args.checkers,
                                         args.queue_depth) < 1:
        p.error(f"--mix takes {', '.join(KINDS)} (got {args.mix}); sizes and counts must be "
                "positive")
    args.mix = mix
    return args


def expected(batch_id, rows, cols):
    """The logical content of batch `batch_id`: exact float32 values (below 2**24)."""
    return ((np.arange(rows * cols, dtype=np.int64) + batch_id * 7919) % (1 << 24)).astype(
        np.float32).reshape(rows, cols)


def make_batch(batch_id, rows, cols, kind):
    """The batch as the producer hands it over, and the content it must arrive with."""
    want = expected(batch_id, rows, cols)
    if kind == "pageable":
        return want.copy(), want
    if batch_id % 2 == 0:
        # A transposed view: the elements of `want`, laid out column-major.
        storage = np.ascontiguousarray(want.T)
        return storage.T, want
    # Every other row of a block twice as tall.
    tall = np.empty((2 * rows, cols), dtype=np.float32)
    tall[0::2] = want
    tall[1::2] = -1.0
    return tall[0::2], want


class Stats:
    def __init__(self):
        self.made = 0
        self.checked = 0
        self.failed = 0
        self.by_kind = {k: {"imports": 0, "copies": 0, "bytes": 0, "latency": []} for k in KINDS}
        self.in_flight = 0
        self.busy = 0.0  # seconds with at least one import in flight
        self.import_time = 0.0  # summed over imports
        self._since = None

    def begin(self):
        if self.in_flight == 0:
            self._since = time.perf_counter()
        self.in_flight += 1

    def end(self):
        self.in_flight -= 1
        if self.in_flight == 0:
            self.busy += time.perf_counter() - self._since


def pick_target(rt, device):
    if device == "cpu":
        return "cpu:0"
    if device != "auto":
        return device
    gpus = [str(d) for d in rt.targets if str(d).startswith("cuda:")]
    return gpus[0] if gpus else "cpu:0"


async def main(args):
    try:
        import torch
    except ImportError:
        print("the pipeline hands its batches to PyTorch: install it (Debian: python3-torch)",
              file=sys.stderr)
        return 2
    cuda = f"sim:{args.sim_gpus}" if args.sim_gpus > 0 else "auto"
    with dlasync.Runtime(cuda=cuda, workers=0) as rt:
        target = pick_target(rt, args.device)
        simulated = target.startswith("cuda") and rt.is_simulated(target)
        on_gpu = target.startswith("cuda")
        direct = on_gpu and not simulated and torch.cuda.is_available()
        label = target + (" (simulated)" if simulated else "")
        floats = max(1, int(args.batch_mib * (1 << 20)) // 4)
        cols = 256
        rows = max(1, floats // cols)
        stats = Stats()
        made = asyncio.Queue(args.queue_depth)
        arrived = asyncio.Queue(args.queue_depth)
        deadline = time.perf_counter() + args.seconds
        next_id = 0

        async def producer():
            nonlocal next_id
            while time.perf_counter() < deadline and (args.items == 0 or next_id < args.items):
                batch_id = next_id
                next_id += 1
                kind = args.mix[batch_id % len(args.mix)]
                x, want = await asyncio.to_thread(make_batch, batch_id, rows, cols, kind)
                stats.made += 1
                await made.put((batch_id, kind, x, want))

        async def importer():
            while (item := await made.get()) is not None:
                batch_id, kind, x, want = item
                stats.begin()
                t0 = time.perf_counter()
                try:
                    t = await rt.import_dlpack(x, device=target, require_contiguous=True)
                except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                    print(f"batch {batch_id} ({kind}) failed to import: {e}", file=sys.stderr)
                    stats.failed += 1
                    continue
                finally:
                    elapsed = time.perf_counter() - t0
                    stats.end()
                stats.import_time += elapsed
                k = stats.by_kind[kind]
                k["imports"] += 1
                k["copies"] += 1 if t.is_copy else 0
                k["bytes"] += want.nbytes
                k["latency"].append(elapsed)
                del x  # the producer's array: a copy no longer needs it
                await arrived.put((batch_id, kind, t, want))

        def check(t, want):
            if direct:
                got = torch.from_dlpack(t)
                return bool(torch.equal(got, torch.from_numpy(want).to(got.device)))
            host = t if not on_gpu else rt.from_dlpack(t, device="cpu:0")
            return bool(torch.equal(torch.from_dlpack(host), torch.from_numpy(want)))

        async def checker():
            while (item := await arrived.get()) is not None:
                batch_id, kind, t, want = item
                if await asyncio.to_thread(check, t, want):
                    stats.checked += 1
                else:
                    print(f"batch {batch_id} ({kind}) arrived with wrong elements",
                          file=sys.stderr)
                    stats.failed += 1

        start = time.perf_counter()
        checkers = [asyncio.create_task(checker()) for _ in range(args.checkers)]
        importers = [asyncio.create_task(importer()) for _ in range(args.concurrency)]
        await asyncio.gather(*(producer() for _ in range(args.producers)))
        for _ in importers:
            await made.put(None)
        await asyncio.gather(*importers)
        for _ in checkers:
            await arrived.put(None)
        await asyncio.gather(*checkers)
        seconds = time.perf_counter() - start
        print_summary(stats, label, rows * cols * 4, seconds, direct)
        return 0 if stats.failed == 0 and stats.checked == stats.made else 1


def print_summary(stats, label, batch_bytes, seconds, direct):
    print(f"\ndlasync Python pipeline: {label}, {batch_bytes / (1 << 20):.2f} MiB float32 "
          f"batches, {seconds:.1f} s\n")
    print("| source   | imports | copies | imports/s |   GB/s | p50 ms | p99 ms |")
    print("|----------|--------:|-------:|----------:|-------:|-------:|-------:|")
    imports = copies = total_bytes = 0
    for kind, k in stats.by_kind.items():
        if k["imports"] == 0:
            continue
        imports += k["imports"]
        copies += k["copies"]
        total_bytes += k["bytes"]
        p50, p99 = (np.percentile(k["latency"], q) * 1e3 for q in (50, 99))
        print(f"| {kind:<8} | {k['imports']:7d} | {k['copies']:6d} | {k['imports'] / seconds:9.1f} "
              f"| {k['bytes'] / seconds / 1e9:6.2f} | {p50:6.2f} | {p99:6.2f} |")
    print(f"| all      | {imports:7d} | {copies:6d} | {imports / seconds:9.1f} "
          f"| {total_bytes / seconds / 1e9:6.2f} |        |        |")
    overlap = 0.0 if stats.import_time == 0 else max(0.0, 1 - stats.busy / stats.import_time)
    print(f"\nchecked {stats.checked} of {stats.made} batches, {stats.failed} failed; "
          f"{overlap * 100:.0f}% of the import time overlapped with other imports; PyTorch read "
          f"them {'on the GPU' if direct else 'on the host'}")


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args(sys.argv[1:]))))
