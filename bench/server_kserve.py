#!/usr/bin/env python3
"""The inference server's REST front (KServe v2) against baselines measured
in the same run, interleaved round by round:

- large binary requests (16 MiB of FP32 to the `sum` model, the tensor
  imported from the body where it landed) against a plain loopback TCP copy
  of the same bytes: one client sends them to a sink that reads them into
  one buffer and answers one byte, the same client code for both;
- the same tensor from a registered system shared-memory region, against
  the binary REST rate;
- small requests (1 KiB of FP32 to `sum`, binary) against the server's own
  GET /v2/health/live, driven by h2load (nghttp2-client) over HTTP/1.1, with
  latency percentiles from its per-request log;
- gRPC (inference.GRPCInferenceService, raw_input_contents, the message
  encoded here) against REST on the same tensors, small and large, both
  driven by h2load (gRPC over HTTP/2). The server's report must show no
  error at the end, since h2load sees HTTP statuses only.

    bench/server_kserve.py BUILD_DIR [--rounds=5] [--mib=16] [--requests=8]
                           [--small_requests=20000] [--connections=4]

Prints each round and the median ratio with its spread.
"""

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import shared_memory

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kserve_bodies import grpc_body  # noqa: E402


def start_server(build, work):
    port_file = os.path.join(work, "http_port")
    grpc_file = os.path.join(work, "grpc_port")
    server = subprocess.Popen(
        [os.path.join(build, "examples", "dlasync_server"), "--http_port=0",
         f"--http_port_file={port_file}", "--grpc_port=0", f"--grpc_port_file={grpc_file}",
         "--device=cpu", "--max_request_mib=64",
         "--memory_budget_mib=512", "--connection_budget_mib=256", "--allow_client_shm"],
        stdout=open(os.path.join(work, "server.out"), "w"), stderr=subprocess.STDOUT)
    for _ in range(300):
        if all(os.path.exists(f) and os.path.getsize(f) > 0 for f in (port_file, grpc_file)):
            return server, int(open(port_file).read()), int(open(grpc_file).read())
        if server.poll() is not None:
            sys.exit("the server exited early: " + open(os.path.join(work, "server.out")).read())
        time.sleep(0.05)
    sys.exit("the server did not start listening")


def start_sink():
    """A plain TCP sink: reads a length-prefixed body into one buffer, answers a byte."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                buf = bytearray(1)
                while True:
                    head = conn.recv(8, socket.MSG_WAITALL)
                    if len(head) < 8:
                        break
                    (n,) = struct.unpack("<Q", head)
                    if len(buf) < n:
                        buf = bytearray(n)
                    view = memoryview(buf)
                    got = 0
                    while got < n:
                        k = conn.recv_into(view[got:n])
                        if k == 0:
                            return
                        got += k
                    conn.sendall(b"k")

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


def read_response(sock):
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, rest = buf.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, value = line.split(b":", 1)
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split(b" ")[1]), rest[:length]


def shm_rate(server_port, region, size, requests):
    """Bytes per second of requests that name `size` bytes of a registered region."""
    doc = json.dumps({"inputs": [{"name": "INPUT0", "shape": [size // 4], "datatype": "FP32",
                                  "parameters": {"shared_memory_region": region,
                                                 "shared_memory_byte_size": size}}]}).encode()
    head = (f"POST /v2/models/sum/infer HTTP/1.1\r\nHost: b\r\n"
            f"Content-Length: {len(doc)}\r\n\r\n").encode() + doc
    with socket.create_connection(("127.0.0.1", server_port)) as s:
        s.sendall(head)
        status, body = read_response(s)
        assert status == 200, body
        start = time.perf_counter()
        for _ in range(requests):
            s.sendall(head)
            status, body = read_response(s)
            assert status == 200, body
        return size * requests / (time.perf_counter() - start)


def large_rates(server_port, sink_port, payload, requests):
    """Bytes per second over the REST front and over the plain sink."""
    n = len(payload) // 4
    doc = json.dumps({"inputs": [{"name": "INPUT0", "shape": [n], "datatype": "FP32",
                                  "parameters": {"binary_data_size": len(payload)}}]}).encode()
    head = (f"POST /v2/models/sum/infer HTTP/1.1\r\nHost: b\r\n"
            f"Inference-Header-Content-Length: {len(doc)}\r\n"
            f"Content-Length: {len(doc) + len(payload)}\r\n\r\n").encode() + doc
    with socket.create_connection(("127.0.0.1", server_port)) as s:
        s.sendall(head)
        s.sendall(payload)
        status, body = read_response(s)  # warm the connection and the server's caches
        assert status == 200, body
        start = time.perf_counter()
        for _ in range(requests):
            s.sendall(head)
            s.sendall(payload)
            status, body = read_response(s)
            assert status == 200, body
        rest = len(payload) * requests / (time.perf_counter() - start)
    with socket.create_connection(("127.0.0.1", sink_port)) as s:
        prefix = struct.pack("<Q", len(payload))
        s.sendall(prefix)
        s.sendall(payload)
        s.recv(1)
        start = time.perf_counter()
        for _ in range(requests):
            s.sendall(prefix)
            s.sendall(payload)
            assert s.recv(1) == b"k"
        plain = len(payload) * requests / (time.perf_counter() - start)
    return rest, plain


def h2load(port, path, requests, connections, work, body=None, headers=(), h1=True):
    log = os.path.join(work, "h2load.log")
    cmd = ["h2load", "-n", str(requests), "-c", str(connections), "-m", "1", "--log-file", log]
    if h1:
        cmd.append("--h1")
    if body is not None:
        body_file = os.path.join(work, "body")
        with open(body_file, "wb") as f:
            f.write(body)
        cmd += ["-d", body_file]
    for h in headers:
        cmd += ["-H", h]
    out = subprocess.run(cmd + [f"http://127.0.0.1:{port}{path}"], capture_output=True,
                         text=True, check=True).stdout
    rate = None
    for line in out.splitlines():
        if line.startswith("finished in"):
            rate = float(line.split(",")[1].split()[0])
        if line.startswith("status codes:"):
            codes = line
    lat = sorted(int(line.split()[2]) for line in open(log) if line.strip())
    if not codes.startswith(f"status codes: {requests} 2xx"):
        sys.exit(f"h2load {path}: not every request got 2xx: {codes}")
    pct = {p: lat[min(len(lat) - 1, int(len(lat) * p / 100))] for p in (50, 90, 99)}
    return rate, pct


def spread(values):
    v = sorted(values)
    return f"{statistics.median(v):.2f} [{v[0]:.2f}-{v[-1]:.2f}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--small_requests", type=int, default=20000)
    ap.add_argument("--connections", type=int, default=4)
    args = ap.parse_args()
    work = tempfile.mkdtemp()
    server, port, grpc_port = start_server(args.build, work)
    sink, sink_port = start_sink()
    try:
        payload = struct.pack("<f", 0.5) * (args.mib << 18)
        segment = shared_memory.SharedMemory(create=True, size=len(payload))
        segment.buf[:] = payload
        doc = json.dumps({"key": "/" + segment.name, "offset": 0,
                          "byte_size": len(payload)}).encode()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall((f"POST /v2/systemsharedmemory/region/bench/register HTTP/1.1\r\n"
                       f"Content-Length: {len(doc)}\r\n\r\n").encode() + doc)
            status, body = read_response(s)
            assert status == 200, body
        print(f"{args.mib} MiB binary requests to sum, against a plain loopback TCP copy, and "
              f"the same tensor from system shared memory")
        print("round  REST MB/s  plain MB/s  REST/plain  shm MB/s  shm/REST")
        ratios = []
        shm_ratios = []
        for r in range(args.rounds):
            rest, plain = large_rates(port, sink_port, payload, args.requests)
            shm = shm_rate(port, "bench", len(payload), args.requests)
            ratios.append(rest / plain)
            shm_ratios.append(shm / rest)
            print(f"{r + 1:5d}  {rest / 1e6:9.0f}  {plain / 1e6:10.0f}  {rest / plain:10.2f}  "
                  f"{shm / 1e6:8.0f}  {shm / rest:8.2f}")
        print(f"median REST/plain {spread(ratios)} over {args.rounds} rounds")
        print(f"median shm/REST {spread(shm_ratios)} over {args.rounds} rounds")
        segment.close()
        segment.unlink()

        if shutil.which("h2load") is None:
            print("small requests: h2load is missing (apt-get install nghttp2-client)")
            return
        values = struct.pack("<256f", *range(256))
        doc = json.dumps({"inputs": [{"name": "INPUT0", "shape": [256], "datatype": "FP32",
                                      "parameters": {"binary_data_size": 1024}}]}).encode()
        grpc_headers = ["content-type: application/grpc", "te: trailers"]
        grpc_path = "/inference.GRPCInferenceService/ModelInfer"
        print(f"\n1 KiB binary requests to sum against GET /v2/health/live (REST, h2load --h1), "
              f"and over gRPC (h2load, HTTP/2), {args.connections} connections, "
              f"{args.small_requests} requests a run")
        print("round  live req/s  REST req/s  REST/live  gRPC req/s  gRPC/REST  "
              "p50/p90/p99 us: live  REST  gRPC")
        ratios, grpc_ratios = [], []
        for r in range(args.rounds):
            live, lp = h2load(port, "/v2/health/live", args.small_requests, args.connections,
                              work)
            infer, ip = h2load(port, "/v2/models/sum/infer", args.small_requests,
                               args.connections, work, body=doc + values,
                               headers=[f"Inference-Header-Content-Length: {len(doc)}"])
            grpc, gp = h2load(grpc_port, grpc_path, args.small_requests, args.connections, work,
                              body=grpc_body(values), headers=grpc_headers, h1=False)
            ratios.append(infer / live)
            grpc_ratios.append(grpc / infer)
            print(f"{r + 1:5d}  {live:10.0f}  {infer:10.0f}  {infer / live:9.2f}  {grpc:10.0f}  "
                  f"{grpc / infer:9.2f}  {lp[50]}/{lp[90]}/{lp[99]}  {ip[50]}/{ip[90]}/{ip[99]}  "
                  f"{gp[50]}/{gp[90]}/{gp[99]}")
        print(f"median REST/live {spread(ratios)}, gRPC/REST {spread(grpc_ratios)} over "
              f"{args.rounds} rounds")

        print(f"\n{args.mib} MiB requests to sum, gRPC against REST (h2load, one connection)")
        print("round  REST MB/s  gRPC MB/s  gRPC/REST")
        big_ratios = []
        for r in range(args.rounds):
            big = struct.pack("<f", 0.5) * (args.mib << 18)
            doc = json.dumps({"inputs": [{"name": "INPUT0", "shape": [len(big) // 4],
                                          "datatype": "FP32",
                                          "parameters": {"binary_data_size": len(big)}}]}).encode()
            rest, _ = h2load(port, "/v2/models/sum/infer", args.requests, 1, work, body=doc + big,
                             headers=[f"Inference-Header-Content-Length: {len(doc)}"])
            grpc, _ = h2load(grpc_port, grpc_path, args.requests, 1, work, body=grpc_body(big),
                             headers=grpc_headers, h1=False)
            big_ratios.append(grpc / rest)
            print(f"{r + 1:5d}  {rest * len(big) / 1e6:9.0f}  {grpc * len(big) / 1e6:9.0f}  "
                  f"{grpc / rest:9.2f}")
        print(f"median gRPC/REST {spread(big_ratios)} over {args.rounds} rounds")
    finally:
        sink.close()
        server.terminate()
        server.wait()
        report = open(os.path.join(work, "server.out")).read()
        shutil.rmtree(work, ignore_errors=True)
    # h2load sees HTTP statuses only (a gRPC error is a 200 with a
    # grpc-status trailer): every request must have been answered OK.
    errors = re.search(r"(\d+) with an error", report)
    if errors is None or int(errors.group(1)) != 0:
        sys.exit("the server answered errors during the benchmark:\n" + report)


if __name__ == "__main__":
    main()
