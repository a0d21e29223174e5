"""dlasync's Python module against NumPy and PyTorch, in one run.

1. Per-call cost of a zero-copy import of the same 1 KiB array:
   rt.from_dlpack, `await rt.import_dlpack` (per import: 100 awaited in
   turn by one task, and 100 gathered tasks), np.from_dlpack and
   torch.from_dlpack, and rt.from_dlpack of a producer written in C through
   its exchange table (tests/python/exchange_producer.c, when built); then,
   from C, the cost per tensor of dlasync's C exchange table beside
   PyTorch's (when PyTorch has one).
2. Strided copies of the same arrays, 4 KiB to --max-bytes: a transpose and
   every other row, as rt.from_dlpack(x, require_contiguous=True) against
   np.ascontiguousarray(x) and torch's x.contiguous() (PyTorch with the same
   thread count as dlasync's workers).

Every ratio is measured interleaved: each repetition times the candidates
back to back on the same warm arrays, in rotating order; the figure is the
median of the per-repetition ratios, with the lowest and highest. A ratio
whose highest is over 1.5 times its lowest is marked "unstable". Each
candidate's own rate is printed beside it. A ratio above 1 means dlasync is
faster.

    /usr/bin/python3 bench/python/bench_python.py [--max-bytes N] [--reps N]
        [--inline-copy-bytes N]
"""
import argparse
import asyncio
import os
import statistics
import time

import numpy as np

import dlasync

try:
    import torch
except ImportError:  # the NumPy columns still run
    torch = None


def per_call(fn, calls):
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def interleaved(candidates, reps, calls):
    """{name: [ns per call, one per repetition]}, in rotating order."""
    names = list(candidates)
    times = {n: [] for n in names}
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            times[n].append(per_call(candidates[n], calls))
    return times


def ratio_stats(base, ours):
    ratios = sorted(b / o for b, o in zip(base, ours))
    return statistics.median(ratios), ratios[0], ratios[-1], len(ratios)


def ratio_text(base, ours):
    med, lo, hi, _ = ratio_stats(base, ours)
    mark = " unstable" if hi > 1.5 * lo else ""
    return f"{med:5.2f} [{lo:.2f}-{hi:.2f}]{mark}"


def record(title, label, nbytes, base, ours):
    """Appends a ratio row to $DLASYNC_BENCH_RATIOS, as the C++ programs do
    (bench/paired.hpp): program, title, label, bytes, unit, the baseline's
    rate, ours, ratio, lowest, highest, repetitions, unstable."""
    path = os.environ.get("DLASYNC_BENCH_RATIOS")
    if not path:
        return
    med, lo, hi, n = ratio_stats(base, ours)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f'python,"{title}","{label}",{nbytes},GB/s,'
                f"{nbytes / statistics.median(base):.6g},{nbytes / statistics.median(ours):.6g},"
                f"{med:.4f},{lo:.4f},{hi:.4f},{n},{1 if hi > 1.5 * lo else 0}\n")


def exchange_consumer():
    """The C consumer of the exchange API the tests build
    (tests/python/exchange_consumer.c), from $DLASYNC_EXCHANGE_CONSUMER or
    the build tree; None when it is not built."""
    import ctypes
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get("DLASYNC_EXCHANGE_CONSUMER") or os.path.join(
        here, "..", "..", "build", "python", "tests", "exchange_consumer.so")
    if not os.path.exists(path):
        return None
    lib = ctypes.PyDLL(path)
    lib.take_release_ns.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.c_int]
    lib.take_release_ns.restype = ctypes.c_double
    lib.view_ns.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.c_int]
    lib.view_ns.restype = ctypes.c_double
    return lib


def exchange_producer():
    """The C producer of the exchange API the tests build
    (tests/python/exchange_producer.c), from $DLASYNC_EXCHANGE_PRODUCER or
    the build tree; None when it is not built."""
    import importlib.util
    import sysconfig
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get("DLASYNC_EXCHANGE_PRODUCER") or os.path.join(
        here, "..", "..", "build", "python", "tests",
        "exchange_producer" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("exchange_producer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_of(obj):
    import ctypes
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get(type(obj).__dlpack_c_exchange_api__, b"dlpack_exchange_api")


def overhead_table(rt, reps):
    a = np.arange(256, dtype=np.float32)
    x = torch.from_numpy(a.copy()) if torch else None
    loop = asyncio.new_event_loop()

    async def sequential():
        # One task awaits 100 imports in turn: the import's own cost.
        imp = rt.import_dlpack
        for _ in range(100):
            await imp(a)

    async def gathered():
        # 100 at once: asyncio makes a Task for each, which costs more than
        # the import.
        await asyncio.gather(*[rt.import_dlpack(a) for _ in range(100)])

    cands = {
        "rt.from_dlpack": lambda: rt.from_dlpack(a),
        "await rt.import_dlpack (one task, in turn)": lambda: loop.run_until_complete(sequential()),
        "await rt.import_dlpack (100 gathered tasks)": lambda: loop.run_until_complete(gathered()),
        "np.from_dlpack": lambda: np.from_dlpack(a),
    }
    if torch:
        cands["torch.from_dlpack"] = lambda: torch.from_dlpack(x)
    producer = exchange_producer()
    if producer is not None:
        # The same 1 KiB (128 float64) from a producer written in C, taken
        # through its exchange table: no Python call to the producer.
        buffer = producer.Buffer(128)
        cands["rt.from_dlpack of a C producer, through its table"] = (
            lambda: rt.from_dlpack(buffer))
    times = interleaved(cands, reps, 2000)
    for n in ("await rt.import_dlpack (one task, in turn)",
              "await rt.import_dlpack (100 gathered tasks)"):
        times[n] = [t / 100 for t in times[n]]
    loop.close()
    record("rt.from_dlpack against np.from_dlpack (per call)", "1 KiB view", 1024,
           times["np.from_dlpack"], times["rt.from_dlpack"])
    print("## Zero-copy import of a 1 KiB array: cost per call (median of repetitions)\n")
    print("| call | ns per call | it vs rt.from_dlpack (ratio [lo-hi]; above 1: dlasync faster) |")
    print("|---|---|---|")
    ours = times["rt.from_dlpack"]
    for n, t in times.items():
        vs = "" if n == "rt.from_dlpack" else ratio_text(t, ours)
        print(f"| {n} | {statistics.median(t):,.0f} | {vs} |")
    print()

    lib = exchange_consumer()
    if lib is None:
        print("(the C exchange API rows need tests/python/exchange_consumer.c built: "
              "build/python/tests/exchange_consumer.so)\n")
        return
    t = rt.from_dlpack(a)
    api = table_of(t)
    cands = {
        "dlasync: managed_tensor_from_py_object_no_sync + deleter":
            lambda: lib.take_release_ns(api, t, 10000),
        "dlasync: dltensor_from_py_object_no_sync": lambda: lib.view_ns(api, t, 10000),
    }
    if torch is not None and hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        tapi = table_of(x)
        cands["PyTorch: managed_tensor_from_py_object_no_sync + deleter"] = \
            lambda: lib.take_release_ns(tapi, x, 10000)
        cands["PyTorch: dltensor_from_py_object_no_sync"] = lambda: lib.view_ns(tapi, x, 10000)
    # Each call returns its own ns per tensor: take the medians of those.
    results = {n: [] for n in cands}
    for r in range(reps):
        names = list(cands)
        for n in names[r % len(names):] + names[:r % len(names)]:
            results[n].append(cands[n]())
    print("## Through the DLPack C exchange API, from C (tests/python/exchange_consumer.c)\n")
    print("| table function | ns per tensor (median [lo-hi]) |")
    print("|---|---|")
    for n, v in results.items():
        print(f"| {n} | {statistics.median(v):,.1f} [{min(v):.1f}-{max(v):.1f}] |")
    print()


def layouts(nbytes):
    side = max(int((nbytes // 4) ** 0.5), 1)
    base = np.random.default_rng(0).standard_normal((side, side), dtype=np.float32)
    return {"transpose": (base, lambda b: b.T), "every other row": (
        np.random.default_rng(0).standard_normal((2 * side, side), dtype=np.float32),
        lambda b: b[::2])}


def copy_table(rt, reps, max_bytes, threads):
    print(f"## Strided copies to compact row-major, float32 "
          f"(dlasync workers and PyTorch threads: {threads}; NumPy: 1 thread)\n")
    print("| layout | size | dlasync GB/s | NumPy GB/s | vs NumPy | PyTorch GB/s | vs PyTorch |")
    print("|---|---|---|---|---|---|---|")
    size = 4096
    while size <= max_bytes:
        for name, (base, view) in layouts(size).items():
            x = view(base)
            nbytes = x.nbytes
            tb = torch.from_numpy(base) if torch else None
            calls = max(1, min(2000, (1 << 22) // max(nbytes, 1)))
            cands = {
                "dlasync": lambda: rt.from_dlpack(x, require_contiguous=True),
                "numpy": lambda: np.ascontiguousarray(x),
            }
            if torch:
                tx = view(tb)
                cands["torch"] = lambda: tx.contiguous()
            times = interleaved(cands, reps, calls)
            gbps = {n: nbytes / statistics.median(t) for n, t in times.items()}
            record("rt.from_dlpack copy against np.ascontiguousarray (NumPy 1 thread)", name,
                   nbytes, times["numpy"], times["dlasync"])
            if torch:
                record(f"rt.from_dlpack copy against torch contiguous() ({threads} threads)", name,
                       nbytes, times["torch"], times["dlasync"])
            row = (f"| {name} | {human(nbytes)} | {gbps['dlasync']:.2f} | {gbps['numpy']:.2f} | "
                   f"{ratio_text(times['numpy'], times['dlasync'])} |")
            if torch:
                row += f" {gbps['torch']:.2f} | {ratio_text(times['torch'], times['dlasync'])} |"
            else:
                row += " - | - |"
            print(row)
        size *= 4
    print()


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} TiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--inline-copy-bytes", type=int, default=None,
                    help="the runtime's inline_copy_bytes (default: the runtime's, 4 MiB)")
    args = ap.parse_args()
    threads = os.cpu_count() or 1
    if torch:
        torch.set_num_threads(threads)
    inline = "default" if args.inline_copy_bytes is None else args.inline_copy_bytes
    print(f"# dlasync Python module: NumPy {np.__version__}, "
          f"PyTorch {torch.__version__ if torch else 'absent'}, {threads} hardware threads, "
          f"inline_copy_bytes {inline}\n")
    with dlasync.Runtime(cuda="off", workers=threads,
                         inline_copy_bytes=args.inline_copy_bytes) as rt:
        overhead_table(rt, args.reps)
        copy_table(rt, args.reps, args.max_bytes, threads)


if __name__ == "__main__":
    main()
