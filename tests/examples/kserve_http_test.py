"""The inference server's REST front (Open Inference Protocol, KServe v2),
driven by raw sockets and by Triton's client library.

Run by run_server_kserve.sh against a server it started: DLASYNC_HTTP is
host:port. The server runs with --read_timeout_ms=1500,
--http_max_header_kib=8 and --max_request_mib=4.
"""

import json
import os
import socket
import struct
import threading
import time

import pytest

ADDRESS = os.environ["DLASYNC_HTTP"]
HOST, PORT = ADDRESS.rsplit(":", 1)
PORT = int(PORT)


def connect(timeout=10.0):
    s = socket.create_connection((HOST, PORT), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


class Reader:
    """Reads HTTP/1.1 responses off one connection."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _fill(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise EOFError("the server closed the connection")
        self.buf += chunk

    def response(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            self._fill()
        body, self.buf = self.buf[:length], self.buf[length:]
        return status, headers, body

    def closed(self):
        """True when the server has closed the connection (and sent nothing more)."""
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return True
                self.buf += chunk
        except (ConnectionResetError, socket.timeout):
            return False


def request(method, path, body=b"", headers=None):
    head = f"{method} {path} HTTP/1.1\r\nHost: {ADDRESS}\r\n"
    for name, value in (headers or {}).items():
        head += f"{name}: {value}\r\n"
    if body or method == "POST":
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def infer_body(inputs, outputs=None, binary=()):
    """A binary-extension body: JSON, then the bytes; its header length."""
    doc = {"inputs": inputs}
    if outputs is not None:
        doc["outputs"] = outputs
    text = json.dumps(doc).encode()
    return text + b"".join(binary), len(text)


def exchange(method, path, body=b"", headers=None):
    with connect() as s:
        s.sendall(request(method, path, body, headers))
        return Reader(s).response()


def error_of(body):
    return json.loads(body)["error"]


def test_binary_inputs_and_outputs_round_trip_through_echo():
    a = struct.pack("<6f", 1.0, -2.5, 3.25, 0.0, 5.5, -6.0)
    b = struct.pack("<3q", -1, 2**40, 7)
    body, hlen = infer_body(
        [
            {"name": "INPUT0", "shape": [2, 3], "datatype": "FP32",
             "parameters": {"binary_data_size": len(a)}},
            {"name": "INPUT1", "shape": [3], "datatype": "INT64",
             "parameters": {"binary_data_size": len(b)}},
        ],
        outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                 {"name": "OUTPUT1", "parameters": {"binary_data": False}}],
        binary=(a, b))
    status, headers, reply = exchange(
        "POST", "/v2/models/echo/infer", body,
        {"Inference-Header-Content-Length": hlen,
         "Content-Type": "application/octet-stream"})
    assert status == 200, reply
    n = int(headers["inference-header-content-length"])
    doc = json.loads(reply[:n])
    assert doc["model_name"] == "echo"
    out0, out1 = doc["outputs"]
    assert out0 == {"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 3],
                    "parameters": {"binary_data_size": 24}}
    assert reply[n:] == a
    assert out1 == {"name": "OUTPUT1", "datatype": "INT64", "shape": [3],
                    "data": [-1, 2**40, 7]}


def test_binary_data_after_json_of_any_length_is_read_right():
    # The server places the body so that the first input's bytes are
    # aligned, whatever the JSON's length; the second input here follows 12
    # bytes of FP32, misaligned for INT64: the import copies it to aligned
    # memory before the model reads it.
    a = struct.pack("<3f", 1.5, 2.5, 3.0)
    b = struct.pack("<2q", -7, 2**62)
    for pad in range(9):
        body, hlen = infer_body(
            [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32",
              "parameters": {"binary_data_size": 12}},
             {"name": "INPUT1", "shape": [2], "datatype": "INT64",
              "parameters": {"binary_data_size": 16}}],
            outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT1"}], binary=(a, b))
        body = b" " * pad + body
        status, _, reply = exchange("POST", "/v2/models/echo/infer", body,
                                    {"Inference-Header-Content-Length": hlen + pad})
        assert status == 200, reply
        out0, out1 = json.loads(reply)["outputs"]
        assert out0["data"] == [1.5, 2.5, 3.0]
        assert out1["data"] == [-7, 2**62]


def test_pipelined_requests_are_answered_in_order_on_one_connection():
    with connect() as s:
        batch = b""
        for i in range(5):
            doc = {"id": str(i), "inputs": [{"name": "INPUT0", "shape": [2],
                                             "datatype": "FP32", "data": [i, 1]}]}
            batch += request("POST", "/v2/models/sum/infer", json.dumps(doc).encode())
            batch += request("GET", "/v2/health/live")
        s.sendall(batch)
        r = Reader(s)
        for i in range(5):
            status, _, body = r.response()
            assert status == 200
            doc = json.loads(body)
            assert doc["id"] == str(i)
            assert doc["outputs"][0]["data"] == [i + 1.0]
            assert r.response()[0] == 200


@pytest.mark.parametrize("doc, words", [
    ({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1]}]},
     "holds 1 elements"),
    ({"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1]}]},
     'model sum has no input "X"; its inputs: INPUT0'),
    ({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP9", "data": [1]}]},
     '"FP9" is not one the protocol defines'),
    ({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1]}]},
     "has shape [-1]"),
    ({"inputs": []}, "the request lacks input INPUT0"),
    ({"inputs": "x"}, '"inputs" is a JSON string, not an array'),
    ({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": ["a"]}]},
     "not a number"),
    ({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}],
      "outputs": [{"name": "NOPE"}]}, 'has no output "NOPE"'),
])
def test_malformed_json_requests_get_400_naming_the_problem(doc, words):
    status, _, body = exchange("POST", "/v2/models/sum/infer", json.dumps(doc).encode())
    assert status == 400
    assert words in error_of(body)


def test_binary_sizes_that_disagree_are_refused():
    values = struct.pack("<3f", 1, 2, 3)
    # shape x datatype disagrees with binary_data_size
    body, hlen = infer_body([{"name": "INPUT0", "shape": [4], "datatype": "FP32",
                              "parameters": {"binary_data_size": 12}}], binary=(values,))
    status, _, reply = exchange("POST", "/v2/models/sum/infer", body,
                                {"Inference-Header-Content-Length": hlen})
    assert status == 400
    assert "binary_data_size of input INPUT0 is 12 bytes" in error_of(reply)
    # a header length past the body
    status, _, reply = exchange("POST", "/v2/models/sum/infer", body,
                                {"Inference-Header-Content-Length": len(body) + 1})
    assert status == 400
    assert "past the body" in error_of(reply)
    status, _, reply = exchange("POST", "/v2/models/sum/infer", body,
                                {"Inference-Header-Content-Length": "-3"})
    assert status == 400
    assert "not a byte count" in error_of(reply)


def test_an_oversized_head_gets_431_and_the_connection_closes():
    with connect() as s:
        s.sendall(b"GET /v2 HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
        r = Reader(s)
        status, headers, body = r.response()
        assert status == 431
        assert headers["connection"] == "close"
        assert r.closed()


def test_an_oversized_body_gets_413_before_it_is_sent():
    with connect() as s:
        s.sendall(b"POST /v2/models/sum/infer HTTP/1.1\r\nContent-Length: 5000000\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        r = Reader(s)
        status, _, body = r.response()
        assert status == 413
        assert "over the server's limit of 4194304 bytes" in error_of(body)
        assert r.closed()


def test_malformed_http_gets_400_and_the_connection_closes():
    with connect() as s:
        s.sendall(b"POST /v2 HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc")
        r = Reader(s)
        status, _, body = r.response()
        assert status == 400
        assert "malformed request" in error_of(body)
        assert r.closed()


def test_a_slow_peer_is_cut_off_and_others_are_served_meanwhile():
    slow = connect()
    slow.sendall(b"POST /v2/models/sum/infer HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"in")
    # While the slow peer holds its connection, another client is served.
    started = time.monotonic()
    for _ in range(5):
        status, _, _ = exchange("GET", "/v2/health/live")
        assert status == 200
    assert time.monotonic() - started < 1.0
    r = Reader(slow)
    status, headers, body = r.response()
    assert status == 408
    assert "--read_timeout_ms" in error_of(body)
    assert r.closed()
    slow.close()


def test_concurrent_clients_each_get_their_own_answers():
    errors = []

    def client(k):
        try:
            with connect() as s:
                r = Reader(s)
                for i in range(20):
                    n = (k * 7 + i) % 50 + 1
                    values = struct.pack(f"<{n}f", *range(n))
                    body, hlen = infer_body([{"name": "INPUT0", "shape": [n], "datatype": "FP32",
                                              "parameters": {"binary_data_size": 4 * n}}],
                                            binary=(values,))
                    s.sendall(request("POST", "/v2/models/sum/infer", body,
                                      {"Inference-Header-Content-Length": hlen}))
                    status, _, reply = r.response()
                    got = json.loads(reply)["outputs"][0]["data"][0]
                    if status != 200 or got != n * (n - 1) / 2:
                        errors.append((k, i, status, reply))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((k, repr(e)))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# Triton's client library, unmodified.
try:
    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
except ImportError as e:  # the Python given has no tritonclient
    if os.environ.get("DLASYNC_REQUIRE_TRITONCLIENT") == "1":
        raise
    httpclient = None
    missing = str(e)

needs_triton = pytest.mark.skipif(httpclient is None,
                                  reason="this Python has no tritonclient (PyPI's peers run it)")


@needs_triton
def test_tritonclient_health_and_metadata():
    c = httpclient.InferenceServerClient(ADDRESS)
    assert c.is_server_live()
    assert c.is_server_ready()
    assert c.is_model_ready("sum")
    assert not c.is_model_ready("nope")
    meta = c.get_server_metadata()
    assert meta["name"] == "dlasync"
    assert "binary_tensor_data" in meta["extensions"]
    m = c.get_model_metadata("echo")
    assert m["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]},
                           {"name": "INPUT1", "datatype": "INT64", "shape": [-1]}]


@needs_triton
@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_infer(binary):
    c = httpclient.InferenceServerClient(ADDRESS)
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
    y = np.array([3, -4, 2**50], dtype=np.int64)
    inputs = [httpclient.InferInput("INPUT0", list(x.shape), "FP32"),
              httpclient.InferInput("INPUT1", list(y.shape), "INT64")]
    inputs[0].set_data_from_numpy(x, binary_data=binary)
    inputs[1].set_data_from_numpy(y, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=not binary)]
    result = c.infer("echo", inputs, outputs=outputs, request_id="t1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), y)
    assert result.get_response()["id"] == "t1"

    s = httpclient.InferInput("INPUT0", [1000], "FP32")
    v = np.linspace(-1, 3, 1000, dtype=np.float32)
    s.set_data_from_numpy(v, binary_data=binary)
    total = c.infer("sum", [s]).as_numpy("SUM")
    assert total.dtype == np.float64
    assert abs(total[0] - float(v.astype(np.float64).sum())) < 1e-6


@needs_triton
def test_tritonclient_sees_the_servers_errors():
    c = httpclient.InferenceServerClient(ADDRESS)
    s = httpclient.InferInput("INPUT0", [2], "INT32")
    s.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="is FP32; the request sends INT32"):
        c.infer("sum", [s])
    with pytest.raises(InferenceServerException, match="not served here"):
        c.get_model_metadata("nope")


# The system shared-memory extension (the server runs with --allow_client_shm).
from multiprocessing import shared_memory  # noqa: E402


def register(name, key, size, offset=0):
    doc = {"key": key, "offset": offset, "byte_size": size}
    return exchange("POST", f"/v2/systemsharedmemory/region/{name}/register",
                    json.dumps(doc).encode())


def unregister(name):
    return exchange("POST", f"/v2/systemsharedmemory/region/{name}/unregister", b"")


def shm_input(region, n, offset=0, name="INPUT0"):
    return {"name": name, "shape": [n], "datatype": "FP32",
            "parameters": {"shared_memory_region": region,
                           "shared_memory_byte_size": 4 * n, "shared_memory_offset": offset}}


@pytest.fixture
def segment():
    seg = shared_memory.SharedMemory(create=True, size=4096)
    yield seg
    seg.close()
    seg.unlink()


def test_shared_memory_inputs_and_outputs(segment):
    key = "/" + segment.name
    segment.buf[:16] = struct.pack("<4f", 1.0, 2.0, 3.5, -1.0)
    assert register("in", key, 1024)[0] == 200
    assert register("out", key, 1024, offset=2048)[0] == 200
    try:
        status, _, body = exchange("GET", "/v2/systemsharedmemory/status")
        regions = {r["name"]: r for r in json.loads(body)}
        assert regions["out"] == {"name": "out", "key": key, "offset": 2048, "byte_size": 1024}
        doc = {"inputs": [shm_input("in", 4)],
               "outputs": [{"name": "OUTPUT0", "parameters": {
                   "shared_memory_region": "out", "shared_memory_byte_size": 16}}]}
        status, _, body = exchange("POST", "/v2/models/negate/infer", json.dumps(doc).encode())
        assert status == 200, body
        out = json.loads(body)["outputs"][0]
        assert out["parameters"] == {"shared_memory_region": "out",
                                     "shared_memory_byte_size": 16}
        assert "data" not in out
        assert struct.unpack("<4f", bytes(segment.buf[2048:2064])) == (-1.0, -2.0, -3.5, 1.0)
        # The input's region is the client's: the server read a copy.
        assert struct.unpack("<4f", bytes(segment.buf[:16])) == (1.0, 2.0, 3.5, -1.0)
    finally:
        unregister("in")
        unregister("out")


def test_shared_memory_refusals_name_the_region_never_the_key(segment):
    key = "/" + segment.name
    assert register("r", key, 64)[0] == 200
    try:
        status, _, body = register("r", key, 64)
        assert status == 409 and "registered already" in error_of(body)
        status, _, body = register("big", key, 8192)
        assert status == 400 and "8192 bytes from offset 0" in error_of(body)
        status, _, body = register("gone", "/dlasync_surely_missing_object", 8)
        assert status == 404 and "surely_missing" not in error_of(body)
        for doc, code, words in [
            ({"inputs": [shm_input("r", 4, offset=56)]}, 400, "past its end"),
            ({"inputs": [shm_input("r", 1, offset=2**64 - 2)]}, 400, "past its end"),
            ({"inputs": [shm_input("nope", 1)]}, 404, '"nope" is not registered'),
        ]:
            status, _, body = exchange("POST", "/v2/models/sum/infer", json.dumps(doc).encode())
            assert status == code, body
            assert words in error_of(body)
            assert segment.name not in error_of(body)
    finally:
        unregister("r")
    status, _, body = unregister("r")
    assert status == 404


def test_unregistering_while_requests_read_the_region(segment):
    key = "/" + segment.name
    segment.buf[:40] = struct.pack("<10f", *range(10))
    answers = {}
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            register("live", key, 4096)
            unregister("live")

    t = threading.Thread(target=churn)
    t.start()
    try:
        doc = json.dumps({"inputs": [shm_input("live", 10)]}).encode()
        for _ in range(200):
            status, _, body = exchange("POST", "/v2/models/sum/infer", doc)
            if status == 200:
                assert json.loads(body)["outputs"][0]["data"] == [45.0]
            else:
                assert status == 404 and "not registered" in error_of(body)
            answers[status] = answers.get(status, 0) + 1
    finally:
        stop.set()
        t.join()
        unregister("live")
    assert sum(answers.values()) == 200


def test_a_region_whose_object_shrinks_is_refused_not_crashed_on():
    seg = shared_memory.SharedMemory(create=True, size=8192)
    key = "/" + seg.name
    try:
        assert register("shrinks", key, 8192)[0] == 200
        fd = os.open("/dev/shm/" + seg.name, os.O_RDWR)
        os.ftruncate(fd, 100)
        os.close(fd)
        doc = {"inputs": [shm_input("shrinks", 16, offset=4096)]}
        status, _, body = exchange("POST", "/v2/models/sum/infer", json.dumps(doc).encode())
        assert status == 400
        assert "no longer holds" in error_of(body)
        assert exchange("GET", "/v2/health/live")[0] == 200
    finally:
        unregister("shrinks")
        seg.close()
        seg.unlink()


@needs_triton
def test_tritonclient_system_shared_memory():
    import tritonclient.utils.shared_memory as shm
    c = httpclient.InferenceServerClient(ADDRESS)
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    key = f"/dlasync_triton_{os.getpid()}"
    handle = shm.create_shared_memory_region("tc_in", key, x.nbytes * 2)
    try:
        shm.set_shared_memory_region(handle, [x])
        c.register_system_shared_memory("tc_in", key, x.nbytes * 2)
        status = c.get_system_shared_memory_status()
        assert any(r["name"] == "tc_in" for r in status)
        inp = httpclient.InferInput("INPUT0", [64], "FP32")
        inp.set_shared_memory("tc_in", x.nbytes)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
        out.set_shared_memory("tc_in", x.nbytes, offset=x.nbytes)
        c.infer("negate", [inp], outputs=[out])
        got = shm.get_contents_as_numpy(handle, np.float32, [64], offset=x.nbytes)
        np.testing.assert_array_equal(got, -x)
        with pytest.raises(InferenceServerException, match="registered already"):
            c.register_system_shared_memory("tc_in", key, 16)
    finally:
        c.unregister_system_shared_memory("tc_in")
        shm.destroy_shared_memory_region(handle)
