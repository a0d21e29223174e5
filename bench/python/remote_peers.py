"""NIXL and Mooncake's transfer engine moving host memory between two
processes on this machine, to set beside dlasync's remote-import benchmark
(bench/bench_remote.cpp, dlasync_bench_remote).

    bench/python/remote_peers.sh --lib nixl|mooncake
        [--sizes=4096,65536,...] [--count=1] [--reps=5]
        [--bytes_per_rep=268435456] [--ucx_tls=shm,tcp] [--gap=4096]
        [--nixl_progress=target|both|none] [--timeout=120]

(remote_peers.sh makes the environment with both libraries and sets the
library path Mooncake needs.)

This process is the initiator. It starts a copy of itself as the target,
which owns the source buffers: per (size, count), `count` buffers of
`size` bytes, filled with a known pattern and registered with the library.
The initiator registers as many destination buffers of its own and READs
the target's buffers into them, all `count` descriptors as ONE batched
transfer (one bundle; count 1 is one buffer).

Excluded from the timing, done once per (size, count): allocating and
filling the buffers, registration on both sides, the metadata exchange
(over a local socket pair), connection set-up and transfer preparation, and
a first transfer whose bytes are checked against the pattern (it also
faults in and warms whatever the libraries set up lazily).

Timed, per repetition: as many back-to-back batched transfers as make up
--bytes_per_rep (at least one), each posted and waited for in turn (one in
flight), into the same, already warm destination buffers:
  - NIXL: the transfer prepared once with prep_xfer_dlist on both sides and
    make_prepped_xfer, re-posted with transfer() and polled with
    check_xfer_state() until DONE;
  - Mooncake: batch_transfer_sync_read, the engine's own blocking call (it
    allocates a batch, submits the requests and spins on their status, per
    call; the engine has no prepared-transfer API).

Printed per (size, count): GB/s (1e9 bytes per second) per repetition, the
lowest, median and highest over the repetitions, and the median batched
transfers per second.

--ucx_tls sets UCX_TLS (UCX's transports, e.g. shm,tcp or tcp) for both
processes; it matters to NIXL only (Mooncake is run with protocol "tcp",
its own sockets). --gap puts that many bytes between a bundle's buffers so
that no library can merge neighbours into one descriptor (0: adjacent, as
a pool's blocks and dlasync's benchmark bundles; NIXL then merges them:
8 adjacent 64 KiB descriptors go out as one). NIXL's progress thread
busy-polls a core; by default only the target has one (it must make
progress where UCX has no one-sided read, as over TCP, where UCX emulates
the read in software: with no progress thread there the read never ends)
and the initiator drives its own progress by polling.

Not the same as dlasync_bench_remote: one transfer in flight (not a
window), no allocation or validation per transfer, the same destination
buffers every time, and NIXL's own UCX (the wheel bundles UCX 1.23; the
system's ucx_perftest is Debian's).

Exit status: 0 when every size ran and its bytes matched, 1 when a transfer
failed or a byte was wrong, 2 when a library will not import or start.
"""
import argparse
import logging
import math
import mmap
import os
import socket
import statistics
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection

import numpy as np

EXIT_FAILED = 1
EXIT_UNAVAILABLE = 2
PAGE = mmap.PAGESIZE
# An odd 64-bit multiplier: word w of buffer b holds (w + b * 2^40 + 1) * M
# modulo 2^64, which is never zero and differs between buffers and offsets.
MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


class Unavailable(Exception):
    """The library will not import, start or register memory here."""


class TransferFailed(Exception):
    pass


# ---------------------------------------------------------------------------
# Buffers: one page-aligned anonymous mapping per side and (size, count),
# holding `count` buffers `size + gap` bytes apart.


class Region:
    def __init__(self, size, count, gap):
        self.size, self.count = size, count
        self.stride = size + gap
        self.length = max(PAGE, self.stride * count)
        self.map = mmap.mmap(-1, self.length)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.base = self.bytes.ctypes.data
        self.addrs = [self.base + i * self.stride for i in range(count)]

    def words(self, i):
        start = i * self.stride
        return self.bytes[start:start + self.size].view(np.uint64)

    def fill_pattern(self):
        for i in range(self.count):
            w = self.words(i)
            w[:] = np.arange(w.size, dtype=np.uint64)
            w += np.uint64((i << 40) + 1)
            w *= MULTIPLIER

    def first_mismatch(self):
        """(buffer, byte offset) of the first word off the pattern, or None."""
        for i in range(self.count):
            w = self.words(i)
            expected = np.arange(w.size, dtype=np.uint64)
            expected += np.uint64((i << 40) + 1)
            expected *= MULTIPLIER
            bad = np.flatnonzero(w != expected)
            if bad.size:
                return i, int(bad[0]) * 8
        return None

    def close(self):
        del self.bytes
        self.map.close()


# ---------------------------------------------------------------------------
# NIXL (UCX backend).


def import_nixl():
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except Exception as e:  # ImportError, or a backend wheel that fails
        raise Unavailable(f"cannot import nixl: {type(e).__name__}: {e}")
    if "NIXL_LOG_LEVEL" not in os.environ:
        # NIXL's Python logger writes INFO lines to stdout, into the table.
        logging.getLogger("nixl").setLevel(logging.WARNING)
    return nixl_agent, nixl_agent_config


def nixl_agent_for(name, progress_thread):
    nixl_agent, nixl_agent_config = import_nixl()
    try:
        agent = nixl_agent(name, nixl_agent_config(
            backends=["UCX"], enable_prog_thread=progress_thread))
    except Exception as e:
        raise Unavailable(f"NIXL agent with UCX: {type(e).__name__}: {e}")
    if "UCX" not in agent.backends:
        raise Unavailable("NIXL has no UCX backend here (plugins: "
                          f"{agent.get_plugin_list()})")
    return agent


class NixlTarget:
    def __init__(self, args):
        self.agent = nixl_agent_for(
            "remote_peers_target", args.nixl_progress in ("target", "both"))
        self.reg = None

    def expose(self, region):
        try:
            self.reg = self.agent.register_memory(
                [(region.base, region.length, 0, "")], "DRAM")
        except Exception as e:
            raise Unavailable(f"NIXL register_memory: {e}")
        # The agent's metadata carries its connection details and the keys
        # of its registered memory; the initiator loads it as is.
        return self.agent.get_agent_metadata()

    def unexpose(self, region):
        self.agent.deregister_memory(self.reg)
        self.reg = None


class NixlInitiator:
    def __init__(self, args):
        self.agent = nixl_agent_for("remote_peers_initiator",
                                    args.nixl_progress == "both")
        self.timeout = args.timeout
        self.remote = None

    def prepare(self, region, remote_addrs, metadata):
        agent = self.agent
        self.reg = agent.register_memory(
            [(region.base, region.length, 0, "")], "DRAM")
        # Loading the metadata again (once per size) brings in the memory the
        # target has just registered; the connection is made once.
        self.remote = agent.add_remote_agent(metadata)
        size, idx = region.size, list(range(region.count))
        self.local_side = agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", [(a, size, 0) for a in region.addrs], "DRAM")
        self.remote_side = agent.prep_xfer_dlist(
            self.remote, [(a, size, 0) for a in remote_addrs], "DRAM")
        self.handle = agent.make_prepped_xfer(
            "READ", self.local_side, idx, self.remote_side, idx)

    def run(self):
        """One batched READ, posted and waited for."""
        agent, handle = self.agent, self.handle
        state = agent.transfer(handle)
        polls = 0
        deadline = None
        while state == "PROC":
            state = agent.check_xfer_state(handle)
            polls += 1
            if polls & 0xFFFF == 0:  # look at the clock now and then only
                now = time.monotonic()
                deadline = deadline or now + self.timeout
                if now > deadline:
                    raise TransferFailed("NIXL transfer still in progress "
                                         f"after {self.timeout} s")
        if state != "DONE":
            raise TransferFailed(f"NIXL transfer state {state}")

    def release(self, region):
        self.agent.release_xfer_handle(self.handle)
        self.agent.release_dlist_handle(self.local_side)
        self.agent.release_dlist_handle(self.remote_side)
        self.agent.deregister_memory(self.reg)

    def describe(self):
        tls = os.environ.get("UCX_TLS", "(UCX's default)")
        return f"NIXL, UCX backend, UCX_TLS={tls}"


# ---------------------------------------------------------------------------
# Mooncake transfer engine, TCP, peer-to-peer handshake (no etcd).


def mooncake_engine():
    try:
        from mooncake.engine import TransferEngine
    except Exception as e:
        hint = ""
        if "libcuda" in str(e) or "libcudart" in str(e):
            hint = (" (run through remote_peers.sh, which puts a CUDA driver"
                    " stub and the CUDA runtime on LD_LIBRARY_PATH)")
        raise Unavailable(
            f"cannot import mooncake.engine: {type(e).__name__}: {e}{hint}")
    engine = TransferEngine()
    # "127.0.0.1" without a port: the engine picks its own RPC port.
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise Unavailable("Mooncake TransferEngine.initialize(127.0.0.1,"
                          " P2PHANDSHAKE, tcp) failed (see its log above)")
    return engine


class MooncakeTarget:
    def __init__(self, args):
        self.engine = mooncake_engine()

    def expose(self, region):
        if self.engine.register_memory(region.base, region.length) != 0:
            raise Unavailable("Mooncake register_memory failed")
        # The initiator reaches the target by this name and fetches its
        # segment (with the registered buffers) in the handshake.
        return f"127.0.0.1:{self.engine.get_rpc_port()}"

    def unexpose(self, region):
        self.engine.unregister_memory(region.base)


class MooncakeInitiator:
    def __init__(self, args):
        self.engine = mooncake_engine()

    def prepare(self, region, remote_addrs, session):
        if self.engine.register_memory(region.base, region.length) != 0:
            raise Unavailable("Mooncake register_memory failed")
        self.session = session
        self.local = list(region.addrs)
        self.remote = list(remote_addrs)
        self.lengths = [region.size] * region.count

    def run(self):
        ret = self.engine.batch_transfer_sync_read(
            self.session, self.local, self.remote, self.lengths)
        if ret != 0:
            raise TransferFailed(
                f"Mooncake batch_transfer_sync_read returned {ret}")

    def release(self, region):
        self.engine.unregister_memory(region.base)

    def describe(self):
        return "Mooncake transfer engine, protocol tcp, P2PHANDSHAKE"


LIBS = {"nixl": (NixlTarget, NixlInitiator),
        "mooncake": (MooncakeTarget, MooncakeInitiator)}


# ---------------------------------------------------------------------------
# The target process: serves requests from the initiator until it is told
# to stop or the socket closes.


def target_main(args):
    conn = Connection(args.ctrl_fd)
    region = None
    try:
        target = LIBS[args.lib][0](args)
        conn.send(("ready", None))
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return 0
            if msg[0] == "expose":
                _, size, count, gap = msg
                region = Region(size, count, gap)
                region.fill_pattern()
                conn.send(("exposed", (region.addrs, target.expose(region))))
            elif msg[0] == "release":
                target.unexpose(region)
                region.close()
                region = None
                conn.send(("released", None))
            elif msg[0] == "quit":
                return 0
    except Unavailable as e:
        conn.send(("unavailable", str(e)))
        return EXIT_UNAVAILABLE
    except Exception:
        conn.send(("failed", traceback.format_exc()))
        return EXIT_FAILED


class Peer:
    """The target process and the socket to it."""

    def __init__(self, args):
        mine, theirs = socket.socketpair()
        cmd = [sys.executable, os.path.abspath(__file__), "--role=target",
               f"--lib={args.lib}", f"--ctrl_fd={theirs.fileno()}",
               f"--nixl_progress={args.nixl_progress}"]
        # The environment (UCX_TLS, LD_LIBRARY_PATH) is inherited.
        self.proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()])
        theirs.close()
        self.conn = Connection(mine.detach())
        self.timeout = args.timeout

    def call(self, *msg):
        if msg:
            self.conn.send(msg)
        if not self.conn.poll(self.timeout):
            raise TransferFailed(f"target did not answer {msg[:1]} in "
                                 f"{self.timeout} s")
        try:
            kind, body = self.conn.recv()
        except EOFError:
            raise TransferFailed(
                f"target exited (status {self.proc.wait()})")
        if kind == "unavailable":
            raise Unavailable(f"target: {body}")
        if kind == "failed":
            raise TransferFailed(f"target failed:\n{body}")
        return body

    def close(self):
        try:
            self.conn.send(("quit",))
        except OSError:
            pass
        self.conn.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------------
# The initiator.


def measure(initiator, peer, size, count, args):
    """Seconds per repetition, and transfers per repetition, after one
    transfer whose bytes are checked."""
    remote_addrs, metadata = peer.call("expose", size, count, args.gap)
    region = Region(size, count, args.gap)
    region.bytes[:] = 0xA5  # not the pattern; also faults the pages in
    initiator.prepare(region, remote_addrs, metadata)
    try:
        initiator.run()
        bad = region.first_mismatch()
        if bad:
            raise TransferFailed(
                f"size {size} count {count}: buffer {bad[0]} differs from "
                f"the pattern at byte {bad[1]} after the first transfer")
        transfers = max(1, math.ceil(args.bytes_per_rep / (size * count)))
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            for _ in range(transfers):
                initiator.run()
            times.append(time.perf_counter() - t0)
        return times, transfers
    finally:
        initiator.release(region)
        region.close()
        peer.call("release")


def initiator_main(args):
    initiator_cls = LIBS[args.lib][1]
    peer = Peer(args)
    status = 0
    try:
        peer.call()  # the target's "ready": its library started
        initiator = initiator_cls(args)
        print(f"# {initiator.describe()}; READ, initiator <- target, two "
              f"processes on this host; {args.reps} reps of >= "
              f"{args.bytes_per_rep} bytes; gap {args.gap}")
        print(f"# {'size':>10} {'count':>5} {'xfers/rep':>9}  "
              f"{'GB/s min':>9} {'median':>9} {'max':>9}  {'xfers/s':>10}")
        sys.stdout.flush()
        for count in args.count:
            for size in args.sizes:
                times, transfers = measure(initiator, peer, size, count, args)
                moved = transfers * size * count
                rates = sorted(moved / t / 1e9 for t in times)
                per_s = statistics.median(transfers / t for t in times)
                print(f"  {size:>10} {count:>5} {transfers:>9}  "
                      f"{rates[0]:>9.3f} {statistics.median(rates):>9.3f} "
                      f"{rates[-1]:>9.3f}  {per_s:>10.0f}")
                sys.stdout.flush()
    except Unavailable as e:
        print(f"remote_peers: {args.lib} unavailable: {e}", file=sys.stderr)
        status = EXIT_UNAVAILABLE
    except TransferFailed as e:
        print(f"remote_peers: {args.lib}: {e}", file=sys.stderr)
        status = EXIT_FAILED
    finally:
        peer.close()
    return status


def int_list(text):
    return [int(v) for v in text.split(",") if v]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", choices=sorted(LIBS), required=True)
    p.add_argument("--sizes", type=int_list,
                   default=[4096, 65536, 1048576, 16777216, 268435456],
                   help="bytes per buffer, comma-separated (multiples of 8)")
    p.add_argument("--count", type=int_list, default=[1],
                   help="buffers per batched transfer (comma list allowed)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--bytes_per_rep", type=int, default=268435456)
    p.add_argument("--ucx_tls", default=None,
                   help="sets UCX_TLS for both processes (NIXL)")
    p.add_argument("--gap", type=int, default=PAGE,
                   help="bytes between a bundle's buffers (multiple of 8)")
    p.add_argument("--nixl_progress", default="target",
                   choices=["target", "both", "none"],
                   help="which NIXL agents run UCX progress threads")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds before a transfer or the target is given up")
    p.add_argument("--role", choices=["initiator", "target"],
                   default="initiator", help=argparse.SUPPRESS)
    p.add_argument("--ctrl_fd", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if any(s <= 0 or s % 8 for s in args.sizes) or args.gap % 8 or \
            args.gap < 0 or any(c <= 0 for c in args.count) or args.reps <= 0:
        p.error("sizes must be positive multiples of 8, gap a multiple of 8,"
                " counts and reps positive")
    if args.ucx_tls:
        # Before NIXL (and so UCX) is loaded; the target inherits it.
        os.environ["UCX_TLS"] = args.ucx_tls
    if args.role == "target":
        return target_main(args)
    return initiator_main(args)


if __name__ == "__main__":
    try:
        status = main()
    except Exception:  # a library call that raised: say so, then leave
        traceback.print_exc()
        status = EXIT_FAILED
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without running the libraries' exit-time destructors: with the
    # nixl wheel's UCX, two copies of libnl-route-3 are loaded (the wheel's,
    # and the system's through the system libibverbs its ib_efa module pulls
    # in), and the second one's destructor crashes at exit (SIGSEGV in
    # rtnl_tc_unregister), which would hide this script's exit status.
    os._exit(status)
