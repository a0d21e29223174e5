"""On a GPU: a NumPy array onto cuda:0 with dlasync against the frameworks,
on the same arrays, in one run.

    await rt.import_dlpack(a, device="cuda:0")
    torch.from_numpy(a).to("cuda")
    torch.from_numpy(a).pin_memory().to("cuda", non_blocking=True)  (then synchronized)
    cupy.asarray(a)                                                  (then synchronized)
    jax.device_put(a).block_until_ready()

Interleaved repetition by repetition in rotating order; each figure is the
median GB/s and the median of the per-repetition ratios (framework time over
dlasync's: above 1, dlasync is faster), with the lowest and highest.

    python3 bench/python/bench_gpu_python.py [--max-bytes N] [--reps N]
"""
import argparse
import asyncio
import statistics
import sys
import time

import numpy as np

import dlasync

try:
    import torch
except ImportError:
    torch = None
try:
    import cupy
except ImportError:
    cupy = None
try:
    import jax
except ImportError:
    jax = None


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    if torch is None or not torch.cuda.is_available():
        print("skipped: no CUDA GPU (PyTorch sees none)")
        return 0
    loop = asyncio.new_event_loop()
    with dlasync.Runtime(cuda="real") as rt:
        cands = {"dlasync": lambda a: loop.run_until_complete(
            rt.import_dlpack(a, device="cuda:0"))}
        cands["torch .to"] = lambda a: torch.from_numpy(a).to("cuda")
        def pinned(a):
            t = torch.from_numpy(a).pin_memory().to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            return t
        cands["torch pinned"] = pinned
        if cupy is not None:
            def cp(a):
                x = cupy.asarray(a)
                cupy.cuda.Stream.null.synchronize()
                return x
            cands["cupy.asarray"] = cp
        gpus = [d for d in jax.devices() if d.platform == "gpu"] if jax is not None else []
        if gpus:
            cands["jax.device_put"] = lambda a: jax.device_put(a, gpus[0]).block_until_ready()
        names = list(cands)
        print("| size | " + " | ".join(f"{n} GB/s" for n in names) + " | " +
              " | ".join(f"dlasync vs {n}" for n in names[1:]) + " |")
        print("|---" * (2 * len(names)) + "|")
        size = 64 << 10
        while size <= args.max_bytes:
            a = np.random.default_rng(0).standard_normal(size // 4, dtype=np.float32)
            for fn in cands.values():
                fn(a)  # warm
            times = {n: [] for n in names}
            for r in range(args.reps):
                order = names[r % len(names):] + names[:r % len(names)]
                for n in order:
                    times[n].append(timed(lambda: cands[n](a)))
            gbps = [size / statistics.median(times[n]) / 1e9 for n in names]
            ratios = []
            for n in names[1:]:
                rs = sorted(t / d for t, d in zip(times[n], times["dlasync"]))
                ratios.append(f"{statistics.median(rs):.2f} [{rs[0]:.2f}-{rs[-1]:.2f}]")
            print(f"| {size >> 10} KiB | " + " | ".join(f"{g:.2f}" for g in gbps) +
                  " | " + " | ".join(ratios) + " |")
            size *= 4
    loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
