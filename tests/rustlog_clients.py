"""Small RustLog clients for the tests, written from the spec tables (not from the engine).

`JsonClient` speaks the JSON dialect and `BinaryClient` the reference broker's binary
dialect, as docs/protocols/rustlog.md describes them. Both share the 4-byte big-endian length framing,
so one `RawConn` can interleave them on a single connection.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import struct
from typing import Any

MAX_FRAME = 10 * 1024 * 1024


class RawConn:
    def __init__(self, port: int, tls: ssl.SSLContext | None = None, timeout: float = 15.0) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock = tls.wrap_socket(sock, server_hostname="localhost") if tls else sock

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">I", len(payload)) + payload)

    def _exact(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            chunk = self.sock.recv(min(n - got, 1 << 20))
            if not chunk:
                if got == 0:
                    return b""
                raise ConnectionError(f"EOF after {got} of {n} bytes")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def recv_frame(self) -> bytes:
        """One payload; b"" when the server closed the connection."""
        try:
            header = self._exact(4)
        except ConnectionResetError:
            return b""
        if not header:
            return b""
        (n,) = struct.unpack(">I", header)
        assert 0 < n <= MAX_FRAME, n
        return self._exact(n)

    def closed_by_server(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawConn":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- JSON dialect


def json_request(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def json_response(payload: bytes) -> dict[str, Any]:
    assert payload[:1] == b"{", payload[:40]
    return json.loads(payload)


class JsonClient:
    def __init__(self, conn: RawConn) -> None:
        self.conn = conn

    def call(self, **fields: Any) -> dict[str, Any]:
        self.conn.send_frame(json_request(**fields))
        return json_response(self.conn.recv_frame())

    def create(self, topic: str, partitions: int = 1) -> dict[str, Any]:
        return self.call(type="CreateTopic", topic=topic, partition_count=partitions)

    def produce(self, topic: str, partition: int, records: list[bytes]) -> dict[str, Any]:
        return self.call(type="Produce", topic=topic, partition=partition,
                         records=[base64.b64encode(r).decode() for r in records])

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20, group_id: str = "") -> dict[str, Any]:
        return self.call(type="Fetch", group_id=group_id, topic=topic, partition=partition, offset=offset, max_bytes=max_bytes)

    def fetch_all(self, topic: str, partition: int, offset: int = 0, max_bytes: int = 4096) -> list[tuple[int, int, bytes]]:
        out = []
        while True:
            resp = self.fetch(topic, partition, offset, max_bytes)
            assert resp["type"] == "FetchResponse", resp
            if not resp["records"]:
                return out
            for r in resp["records"]:
                out.append((r["offset"], r["timestamp"], base64.b64decode(r["payload"])))
            assert resp["next_offset"] == resp["records"][-1]["offset"] + 1
            offset = resp["next_offset"]


# ---------------------------------------------------------------- binary dialect


def b_str(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">H", len(raw)) + raw


def b_list(items: list[bytes]) -> bytes:
    return struct.pack(">I", len(items)) + b"".join(struct.pack(">I", len(i)) + i for i in items)


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 1

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take(">H")
        raw = self.data[self.pos:self.pos + n]
        self.pos += n
        return raw.decode()

    def blist(self) -> list[bytes]:
        out = []
        for _ in range(self.take(">I")):
            n = self.take(">I")
            out.append(self.data[self.pos:self.pos + n])
            self.pos += n
        return out

    def done(self) -> None:
        assert self.pos == len(self.data), (self.pos, len(self.data))


def binary_response(payload: bytes) -> tuple[Any, ...]:
    """("produce", base, count), ("fetch", [payloads], next), ("error", code, message), ..."""
    c = _Cursor(payload)
    code = payload[0]
    if code == 0x01:
        out: tuple[Any, ...] = ("produce", c.take(">Q"), c.take(">I"))
    elif code == 0x02:
        out = ("fetch", c.blist(), c.take(">Q"))
    elif code == 0x03:
        out = ("commit", c.take(">B"))
    elif code == 0x04:
        out = ("offset", c.take(">Q") if c.take(">B") == 1 else None)
    elif code == 0x05:
        out = ("create", c.take(">B"))
    elif code == 0x06:
        out = ("topics", [(c.string(), c.take(">I")) for _ in range(c.take(">I"))])
    elif code == 0x07:
        topic, count = c.string(), c.take(">I")
        out = ("describe_topic", topic, count, [(c.take(">I"), c.take(">Q")) for _ in range(c.take(">I"))])
    elif code == 0x08:
        out = ("describe_partition", c.string(), c.take(">I"), c.take(">Q"))
    elif code == 0x09:
        n = c.take(">I")
        out = ("metrics", payload[c.pos:c.pos + n].decode())
        c.pos += n
    elif code == 0xFE:
        out = ("error", c.take(">H"), c.string())
    elif code == 0xFF:
        out = ("pong",)
    else:
        raise AssertionError(f"unknown binary response 0x{code:02X}")
    c.done()
    return out


class BinaryClient:
    def __init__(self, conn: RawConn) -> None:
        self.conn = conn

    def call(self, payload: bytes) -> tuple[Any, ...]:
        self.conn.send_frame(payload)
        return binary_response(self.conn.recv_frame())

    def produce(self, topic: str, partition: int, records: list[bytes]) -> tuple[Any, ...]:
        return self.call(b"\x01" + b_str(topic) + struct.pack(">I", partition) + b_list(records))

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20, group_id: str = "") -> tuple[Any, ...]:
        return self.call(b"\x02" + b_str(group_id) + b_str(topic) + struct.pack(">IQI", partition, offset, max_bytes))

    def commit(self, group: str, topic: str, partition: int, offset: int) -> tuple[Any, ...]:
        return self.call(b"\x03" + b_str(group) + b_str(topic) + struct.pack(">IQ", partition, offset))

    def offset_fetch(self, group: str, topic: str, partition: int) -> tuple[Any, ...]:
        return self.call(b"\x04" + b_str(group) + b_str(topic) + struct.pack(">I", partition))

    def create(self, topic: str, partitions: int) -> tuple[Any, ...]:
        return self.call(b"\x05" + b_str(topic) + struct.pack(">I", partitions))

    def list_topics(self) -> tuple[Any, ...]:
        return self.call(b"\x06")

    def describe_topic(self, topic: str) -> tuple[Any, ...]:
        return self.call(b"\x07" + b_str(topic))

    def describe_partition(self, topic: str, partition: int) -> tuple[Any, ...]:
        return self.call(b"\x08" + b_str(topic) + struct.pack(">I", partition))

    def metrics(self) -> tuple[Any, ...]:
        return self.call(b"\x09")

    def ping(self) -> tuple[Any, ...]:
        return self.call(b"\xff")

    def fetch_all(self, topic: str, partition: int, offset: int = 0, max_bytes: int = 4096) -> list[bytes]:
        out: list[bytes] = []
        while True:
            kind, records, next_offset = self.fetch(topic, partition, offset, max_bytes)
            assert kind == "fetch"
            if not records:
                return out
            out += records
            assert next_offset == offset + len(records)
            offset = next_offset
