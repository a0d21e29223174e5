"""The inference server's gRPC front (inference.GRPCInferenceService), driven
by Triton's client library and, for messages no well-behaved client sends,
by its generated stubs directly.

Run by run_server_kserve.sh against a server it started: DLASYNC_GRPC is
host:port. The server runs with --allow_client_shm and --max_request_mib=4.
Skipped where the Python given has no tritonclient.grpc, unless
DLASYNC_REQUIRE_TRITONCLIENT=1.
"""

import os
import threading

import pytest

try:
    import grpc
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    from tritonclient.utils import InferenceServerException
except ImportError:
    if os.environ.get("DLASYNC_REQUIRE_TRITONCLIENT") == "1":
        raise
    pytest.skip("this Python has no tritonclient.grpc (the clients' environment runs it)",
                allow_module_level=True)

ADDRESS = os.environ["DLASYNC_GRPC"]


@pytest.fixture(scope="module")
def client():
    return grpcclient.InferenceServerClient(ADDRESS)


@pytest.fixture(scope="module")
def stub():
    channel = grpc.insecure_channel(ADDRESS, options=[
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.max_receive_message_length", 64 << 20)])
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def call_error(stub, request):
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request)
    return e.value.code(), e.value.details()


def test_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("sum")
    assert client.is_model_ready("sum", "1")
    assert not client.is_model_ready("sum", "2")
    assert not client.is_model_ready("nope")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "dlasync"
    assert meta["extensions"] == ["binary_tensor_data", "system_shared_memory"]
    m = client.get_model_metadata("echo", as_json=True)
    assert m["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "-1"]},
                           {"name": "INPUT1", "datatype": "INT64", "shape": ["-1"]}]
    with pytest.raises(InferenceServerException, match="not served here"):
        client.get_model_metadata("nope")


def test_infer_with_raw_contents(client):
    x = (np.arange(20, dtype=np.float32).reshape(4, 5) - 7.25)
    y = np.array([1, -2, 2**60], dtype=np.int64)
    inputs = [grpcclient.InferInput("INPUT0", list(x.shape), "FP32"),
              grpcclient.InferInput("INPUT1", list(y.shape), "INT64")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    result = client.infer("echo", inputs, request_id="g1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), y)
    assert result.get_response().id == "g1"
    # negate writes its input: the request's bytes are gRPC's and read-only,
    # so the import copies them first.
    v = np.linspace(-1, 1, 33, dtype=np.float32)
    n = grpcclient.InferInput("INPUT0", [33], "FP32")
    n.set_data_from_numpy(v)
    np.testing.assert_array_equal(client.infer("negate", [n]).as_numpy("OUTPUT0"), -v)
    s = grpcclient.InferInput("INPUT0", [1000], "FP32")
    s.set_data_from_numpy(np.ones(1000, np.float32))
    assert client.infer("sum", [s]).as_numpy("SUM")[0] == 1000.0


def tensor(name, datatype, shape):
    t = service_pb2.ModelInferRequest().InferInputTensor()
    t.name, t.datatype = name, datatype
    t.shape.extend(shape)
    return t


def test_infer_with_typed_contents(stub):
    r = service_pb2.ModelInferRequest(model_name="echo")
    a = tensor("INPUT0", "FP32", [1, 3])
    a.contents.fp32_contents.extend([1.5, -2.0, 3.25])
    b = tensor("INPUT1", "INT64", [2])
    b.contents.int64_contents.extend([-9, 2**62])
    r.inputs.extend([a, b])
    out = stub.ModelInfer(r)
    assert np.frombuffer(out.raw_output_contents[0], np.float32).tolist() == [1.5, -2.0, 3.25]
    assert np.frombuffer(out.raw_output_contents[1], np.int64).tolist() == [-9, 2**62]


def sum_request(values, datatype="FP32", shape=None, raw=None):
    r = service_pb2.ModelInferRequest(model_name="sum")
    t = tensor("INPUT0", datatype, shape if shape is not None else [len(values)])
    if raw is not None:
        r.raw_input_contents.extend(raw)
    else:
        t.contents.fp32_contents.extend(values)
    r.inputs.append(t)  # a copy: filled first
    return r


@pytest.mark.parametrize("make, code, words", [
    (lambda: sum_request([], raw=[b"\0" * 8, b"\0" * 8], shape=[2]),
     grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents holds 2 entries; 1 inputs take them"),
    (lambda: sum_request([], raw=[b"\0" * 12], shape=[4]),
     grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents[0] of input INPUT0 holds 12 bytes"),
    (lambda: sum_request([1.0, 2.0], shape=[3]),
     grpc.StatusCode.INVALID_ARGUMENT, "hold 2 elements in the field of FP32"),
    (lambda: sum_request([1.0], shape=[-1]),
     grpc.StatusCode.INVALID_ARGUMENT, "extents are integers >= 0"),
    (lambda: sum_request([1.0], datatype="FP8"),
     grpc.StatusCode.INVALID_ARGUMENT, '"FP8" is not one the protocol defines'),
    (lambda: sum_request([1.0], datatype="FP16", shape=[1]),
     grpc.StatusCode.INVALID_ARGUMENT, "send it in raw_input_contents"),
    (lambda: sum_request([], shape=[2**40, 2**40], raw=[b""]),
     grpc.StatusCode.INVALID_ARGUMENT, "overflows 64 bits"),
])
def test_malformed_requests_get_the_status_naming_the_problem(stub, make, code, words):
    got_code, details = call_error(stub, make())
    assert got_code == code
    assert words in details


def test_unknown_models_inputs_and_out_of_range_values(stub):
    r = sum_request([1.0])
    r.model_name = "nope"
    code, details = call_error(stub, r)
    assert code == grpc.StatusCode.NOT_FOUND and "not served here" in details
    r = service_pb2.ModelInferRequest(model_name="sum")
    t = tensor("INPUT0", "INT8", [1])
    t.contents.int_contents.append(300)
    r.inputs.append(t)
    code, details = call_error(stub, r)
    assert "element 0 of input INPUT0 is 300, not a value of INT8" in details
    r = sum_request([1.0])
    r.raw_input_contents.append(b"\0" * 4)
    code, details = call_error(stub, r)
    assert "has contents, but the request gives raw_input_contents" in details


def test_a_message_over_the_limit_is_refused(stub):
    r = sum_request([], shape=[(5 << 20) // 4], raw=[b"\0" * (5 << 20)])
    code, _ = call_error(stub, r)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


def raw_infer(stub_channel, message):
    """ModelInfer with the message's bytes as given, not made by protobuf."""
    call = stub_channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=None,
                                    response_deserializer=service_pb2.ModelInferResponse.FromString)
    with pytest.raises(grpc.RpcError) as e:
        call(message)
    return e.value.code(), e.value.details()


@pytest.fixture(scope="module")
def channel():
    return grpc.insecure_channel(ADDRESS, options=[
        ("grpc.max_send_message_length", 64 << 20)])


def test_a_message_of_many_tiny_fields_is_refused_before_it_is_parsed(channel, stub):
    # 1.9 million empty inputs (field 5, length 0): 3.8 MB on the wire, under
    # --max_request_mib=4, and hundreds of MB once parsed, far past the
    # server's 32 MiB budget.
    message = b"\x0a\x03sum" + b"\x2a\x00" * 1_900_000
    code, details = raw_infer(channel, message)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "once parsed (many small fields)" in details and "raw_input_contents" in details
    # The server goes on answering.
    assert stub.ModelInfer(sum_request([1.0, 2.0])).model_name == "sum"


def test_a_field_the_message_does_not_have_is_refused(channel):
    # Field 99 (varint 1) after a valid request.
    message = sum_request([1.0]).SerializeToString() + b"\x98\x06\x01"
    code, details = raw_infer(channel, message)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "field 99 is not one of inference.ModelInferRequest's" in details


def test_bytes_that_are_no_message_are_refused(channel):
    code, details = raw_infer(channel, b"\xff" * 16)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "the bytes are not a ModelInferRequest" in details


def test_concurrent_calls_each_get_their_own_answer(client):
    errors = []

    def run(k):
        try:
            for i in range(20):
                n = (k * 5 + i) % 40 + 1
                s = grpcclient.InferInput("INPUT0", [n], "FP32")
                s.set_data_from_numpy(np.arange(n, dtype=np.float32))
                got = client.infer("sum", [s]).as_numpy("SUM")[0]
                if got != n * (n - 1) / 2:
                    errors.append((k, i, got))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((k, repr(e)))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_system_shared_memory(client):
    import tritonclient.utils.shared_memory as shm
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    key = f"/dlasync_grpc_{os.getpid()}"
    handle = shm.create_shared_memory_region("g_io", key, x.nbytes * 2)
    try:
        shm.set_shared_memory_region(handle, [x])
        client.register_system_shared_memory("g_io", key, x.nbytes * 2)
        status = client.get_system_shared_memory_status(as_json=True)
        assert status["regions"]["g_io"]["key"] == key
        with pytest.raises(InferenceServerException, match="registered already"):
            client.register_system_shared_memory("g_io", key, 16)
        inp = grpcclient.InferInput("INPUT0", [100], "FP32")
        inp.set_shared_memory("g_io", x.nbytes)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("g_io", x.nbytes, offset=x.nbytes)
        result = client.infer("negate", [inp], outputs=[out])
        assert result.get_output("OUTPUT0").parameters["shared_memory_byte_size"].int64_param \
            == x.nbytes
        got = shm.get_contents_as_numpy(handle, np.float32, [100], offset=x.nbytes)
        np.testing.assert_array_equal(got, -x)
        past = grpcclient.InferInput("INPUT0", [100], "FP32")
        past.set_shared_memory("g_io", x.nbytes, offset=x.nbytes + 4)
        with pytest.raises(InferenceServerException, match="past its end") as e:
            client.infer("sum", [past])
        assert key not in str(e.value)
    finally:
        client.unregister_system_shared_memory("g_io")
        shm.destroy_shared_memory_region(handle)
    with pytest.raises(InferenceServerException, match="not registered"):
        client.unregister_system_shared_memory("g_io")
