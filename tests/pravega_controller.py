"""A minimal Pravega controller (gRPC) for the PyPI `pravega` client, in front of one segment bridge.

The real client always asks a controller where a stream's segments live before it
talks the segment-store wire protocol. This one answers just what a writer needs,
for fixed single-segment streams: createScope, createStream (which creates segment
`scope/stream/0.#epoch.0` on the bridge with a wire-protocol CreateSegment),
getCurrentSegments (that one segment, key range 0..1) and getURI (the bridge).
Other calls get UNIMPLEMENTED and are recorded in `unknown_calls`.

The protobuf messages are encoded and decoded by hand (field numbers and types of
the controller API's messages; no generated code), through grpcio's generic handlers.
"""

from __future__ import annotations

import struct
import threading
from concurrent import futures
from typing import Callable

import grpc

from bridges.segment import engine as wire
from harness.segment_client import SegmentTestClient

SERVICE = "io.pravega.controller.stream.api.grpc.v1.ControllerService"

# --- protobuf wire format -----------------------------------------------------------------------


def _varint(v: int) -> bytes:
    v &= 0xFFFFFFFFFFFFFFFF  # negative int64 values take ten bytes
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num: int, v: int) -> bytes:
    return _varint(num << 3) + _varint(v) if v else b""


def field_bytes(num: int, v: bytes | str) -> bytes:
    raw = v.encode() if isinstance(v, str) else v
    return _varint(num << 3 | 2) + _varint(len(raw)) + raw


def field_double(num: int, v: float) -> bytes:
    return _varint(num << 3 | 1) + struct.pack("<d", v)


def parse(data: bytes) -> dict[int, list]:
    """Field number -> values (ints for varints/fixed, bytes for length-delimited)."""
    out: dict[int, list] = {}
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = value = 0
        while True:
            b = data[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    while pos < len(data):
        key = varint()
        num, kind = key >> 3, key & 7
        if kind == 0:
            value: int | bytes = varint()
        elif kind == 1:
            value = struct.unpack_from("<Q", data, pos)[0]
            pos += 8
        elif kind == 2:
            n = varint()
            value = data[pos : pos + n]
            pos += n
        elif kind == 5:
            value = struct.unpack_from("<I", data, pos)[0]
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {kind}")
        out.setdefault(num, []).append(value)
    return out


def _string(msg: dict[int, list], num: int) -> str:
    return msg.get(num, [b""])[0].decode()


def stream_info(raw: bytes) -> tuple[str, str]:
    msg = parse(raw)
    return _string(msg, 1), _string(msg, 2)


# --- the controller -----------------------------------------------------------------------------


def segment_name(scope: str, stream: str) -> str:
    return f"{scope}/{stream}/0.#epoch.0"


class MiniController:
    def __init__(self, bridge_port: int, bridge_host: str = "127.0.0.1") -> None:
        self.bridge_host = bridge_host
        self.bridge_port = bridge_port
        self.scopes: set[str] = set()
        self.streams: set[tuple[str, str]] = set()
        self.calls: list[str] = []
        self.unknown_calls: list[str] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers([_Handlers(self)])
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> "MiniController":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=None)

    # Each handler takes the request bytes and returns the response bytes.

    def createScope(self, req: bytes) -> bytes:
        scope = _string(parse(req), 1)
        with self._lock:
            status = 2 if scope in self.scopes else 0  # SCOPE_EXISTS / SUCCESS
            self.scopes.add(scope)
        return field_varint(1, status)

    def createStream(self, req: bytes) -> bytes:
        scope, stream = stream_info(parse(req).get(1, [b""])[0])
        with self._lock:
            if scope not in self.scopes:
                return field_varint(1, 3)  # SCOPE_NOT_FOUND
            if (scope, stream) in self.streams:
                return field_varint(1, 2)  # STREAM_EXISTS
            self.streams.add((scope, stream))
        with SegmentTestClient(self.bridge_port, self.bridge_host) as c:
            c.hello()
            reply = c.create_segment(segment_name(scope, stream))
        ok = isinstance(reply, (wire.SegmentCreated, wire.SegmentAlreadyExists))
        return field_varint(1, 0 if ok else 1)  # SUCCESS / FAILURE

    def getCurrentSegments(self, req: bytes) -> bytes:
        scope, stream = stream_info(req)
        info = field_bytes(1, scope) + field_bytes(2, stream)
        segment_id = field_bytes(1, info) + field_varint(2, 0)
        rng = field_bytes(1, segment_id) + field_double(2, 0.0) + field_double(3, 1.0)
        return field_bytes(1, rng) + field_bytes(2, "")

    def getURI(self, req: bytes) -> bytes:
        return field_bytes(1, self.bridge_host) + field_varint(2, self.bridge_port)

    def getDelegationToken(self, req: bytes) -> bytes:
        return field_bytes(1, "")

    def isSegmentValid(self, req: bytes) -> bytes:
        return field_varint(1, 1)

    def checkScopeExists(self, req: bytes) -> bytes:
        return field_varint(1, 1 if _string(parse(req), 1) in self.scopes else 0)

    def checkStreamExists(self, req: bytes) -> bytes:
        return field_varint(1, 1 if stream_info(req) in self.streams else 0)


class _Handlers(grpc.GenericRpcHandler):
    def __init__(self, controller: MiniController) -> None:
        self.controller = controller

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        service, _, method = details.method.lstrip("/").rpartition("/")
        fn: Callable[[bytes], bytes] | None = getattr(self.controller, method, None) if service == SERVICE else None
        if fn is None or method.startswith("_"):
            self.controller.unknown_calls.append(details.method)
            return None
        self.controller.calls.append(method)
        return grpc.unary_unary_rpc_method_handler(
            lambda req, ctx: fn(req), request_deserializer=None, response_serializer=None
        )


def main() -> None:
    """Run as its own process: the `pravega` client holds the GIL while it waits for us."""
    import argparse
    import signal
    import sys

    ap = argparse.ArgumentParser(description="a minimal Pravega controller for one segment bridge")
    ap.add_argument("--bridge-port", type=int, required=True)
    args = ap.parse_args()
    ctl = MiniController(args.bridge_port).start()
    print(f"port {ctl.port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    print(f"calls {' '.join(ctl.calls)}", flush=True)
    print(f"unknown {' '.join(ctl.unknown_calls)}", flush=True)
    ctl.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
