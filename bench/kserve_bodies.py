#!/usr/bin/env python3
"""Request bodies for the inference server's `sum` model, as load generators
send them: KServe v2 REST with binary tensor data, and a gRPC frame of a
ModelInferRequest with raw contents (the message encoded here, so that no
gRPC or protobuf package is needed).

    bench/kserve_bodies.py DIR ELEMENTS
writes DIR/rest.body, DIR/rest.header (its Inference-Header-Content-Length
header line) and DIR/grpc.body, for ELEMENTS float32 values 0, 1, 2, ...
"""

import json
import os
import struct
import sys


def varint(n):
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def delimited(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def grpc_body(payload):
    """A gRPC frame of a ModelInferRequest to sum with `payload` as INPUT0's raw
    contents (the request's fields 1, 5 and 7; the tensor's 1, 2 and 3)."""
    shape = varint(len(payload) // 4)
    tensor = delimited(1, b"INPUT0") + delimited(2, b"FP32") + delimited(3, shape)
    message = delimited(1, b"sum") + delimited(5, tensor) + delimited(7, payload)
    return b"\0" + struct.pack(">I", len(message)) + message


def rest_body(payload):
    """The JSON and the bytes, and the JSON's length."""
    doc = json.dumps({"inputs": [{"name": "INPUT0", "shape": [len(payload) // 4],
                                  "datatype": "FP32",
                                  "parameters": {"binary_data_size": len(payload)}}]}).encode()
    return doc + payload, len(doc)


def main():
    out, elements = sys.argv[1], int(sys.argv[2])
    payload = struct.pack(f"<{elements}f", *range(elements))
    body, header_length = rest_body(payload)
    with open(os.path.join(out, "rest.body"), "wb") as f:
        f.write(body)
    with open(os.path.join(out, "rest.header"), "w") as f:
        f.write(f"Inference-Header-Content-Length: {header_length}\n")
    with open(os.path.join(out, "grpc.body"), "wb") as f:
        f.write(grpc_body(payload))


if __name__ == "__main__":
    main()
