#!/usr/bin/env python3
"""Host-device transfers of the Python frameworks on this machine's first GPU.

    python3 bench/frameworks_gpu.py [--max-bytes N] [--dlasync-csv FILE]

Measures, for each framework that is installed and sees a GPU (PyTorch, CuPy,
JAX), float32 transfers of 4 MiB to --max-bytes (times 4 each step), each
waited for: PyTorch `tensor.to("cuda")` from pageable and from pinned memory
and `.cpu()` back, CuPy `cupy.asarray` and `cupy.asnumpy`, JAX
`jax.device_put(...).block_until_ready()` (not back: a JAX array keeps the
host copy it made once, so repeated reads would measure that cache). Prints the
median rate of 5 repetitions of each. With --dlasync-csv (the CSV that
dlasync_bench_gpu wrote in the same run, --benchmark_out), also prints
dlasync's pageable import rate over each framework's rate on the same sizes.
A framework that is missing, or sees no GPU, is reported as such and skipped.
"""

import argparse
import csv
import statistics
import time

REPETITIONS = 5


def sizes(max_bytes):
    out = []
    b = 4 << 20
    while b <= max_bytes:
        out.append(b)
        b *= 4
    return out or [max_bytes]


def median_rate(nbytes, run, sync):
    """Median GB/s of REPETITIONS timings, each of enough calls to take ~50 ms."""
    run()  # warm: allocations, pages, caches
    sync()
    start = time.perf_counter()
    run()
    sync()
    one = max(time.perf_counter() - start, 1e-6)
    calls = max(1, min(50, int(0.05 / one)))
    rates = []
    for _ in range(REPETITIONS):
        start = time.perf_counter()
        for _ in range(calls):
            run()
            sync()
        rates.append(nbytes * calls / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def torch_paths(nbytes):
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU")
    n = nbytes // 4
    pageable = torch.ones(n, dtype=torch.float32)
    pinned = pageable.pin_memory()
    on_gpu = pageable.to("cuda")
    sync = torch.cuda.synchronize
    return {
        "h2d pageable": (lambda: pageable.to("cuda"), sync),
        "h2d pinned": (lambda: pinned.to("cuda", non_blocking=True), sync),
        "d2h pageable": (lambda: on_gpu.cpu(), sync),
    }


def cupy_paths(nbytes):
    import cupy
    import numpy as np

    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("cupy sees no GPU")
    host = np.ones(nbytes // 4, dtype=np.float32)
    on_gpu = cupy.asarray(host)

    def sync():
        cupy.cuda.Stream.null.synchronize()

    return {
        "h2d pageable": (lambda: cupy.asarray(host), sync),
        "d2h pageable": (lambda: cupy.asnumpy(on_gpu), sync),
    }


def jax_paths(nbytes):
    import jax
    import numpy as np

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        raise RuntimeError("jax sees no GPU")
    host = np.ones(nbytes // 4, dtype=np.float32)
    return {
        "h2d pageable": (lambda: jax.device_put(host, gpus[0]).block_until_ready(), lambda: None),
    }


def dlasync_rates(path):
    """{(direction, bytes): GB/s} of dlasync's imports from a Google Benchmark CSV."""
    rates = {}
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith(("name,", '"'))]
    for row in csv.DictReader(lines):
        name = row["name"]
        if not name.endswith("_median") or not row.get("bytes_per_second"):
            continue
        # The pairs' rates are the import's (bench/paired.hpp): from the
        # pair against pinned memory, of each direction.
        part = name.split("/")
        if part[:2] == ["h2d", "pinned"]:
            rates[("h2d", int(part[2]))] = float(row["bytes_per_second"]) / 1e9
        elif part[:2] == ["d2h", "pinned"]:
            rates[("d2h", int(part[2]))] = float(row["bytes_per_second"]) / 1e9
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--dlasync-csv")
    args = parser.parse_args()
    ours = dlasync_rates(args.dlasync_csv) if args.dlasync_csv else {}

    print("frameworks on the GPU (medians of %d repetitions)" % REPETITIONS)
    print("%-8s %-14s %12s %10s %12s" % ("library", "path", "bytes", "GB/s", "dlasync/it"))
    for name, paths_of in (("torch", torch_paths), ("cupy", cupy_paths), ("jax", jax_paths)):
        try:
            __import__(name)
        except Exception as e:  # not installed, or broken
            print("%-8s not measured: cannot import it (%s)" % (name, e))
            continue
        for nbytes in sizes(args.max_bytes):
            try:
                paths = paths_of(nbytes)
            except Exception as e:
                print("%-8s not measured: %s" % (name, e))
                break
            for path, (run, sync) in paths.items():
                rate = median_rate(nbytes, run, sync)
                ref = ours.get((path.split()[0], nbytes))
                ratio = "%.2f" % (ref / rate) if ref else "-"
                print("%-8s %-14s %12d %10.2f %12s" % (name, path, nbytes, rate, ratio))
            del paths


if __name__ == "__main__":
    main()
