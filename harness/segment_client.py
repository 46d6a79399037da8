"""A blocking Pravega-protocol test client, written from the protocol as docs/protocols/segment.md describes it.

It speaks the segment store's wire protocol over a real socket (optionally TLS),
using the client half of the sans-IO engine for framing, and offers the calls a
Pravega writer or reader makes: Hello, CreateSegment, SetupAppend, appends in the
standalone and block forms, ConditionalAppend, ReadSegment, GetStreamSegmentInfo,
SealSegment, KeepAlive.
"""

from __future__ import annotations

import socket
import ssl
import time
import uuid
from collections import deque
from typing import Sequence, TypeVar

from bridges.segment import engine as wire

T = TypeVar("T")


class ServerClosed(Exception):
    """The server closed the connection."""


class SegmentTestClient:
    def __init__(self, port: int, host: str = "127.0.0.1", *, tls: ssl.SSLContext | None = None, timeout: float = 15.0) -> None:
        raw = socket.create_connection((host, port), timeout=timeout)
        self.sock: socket.socket = tls.wrap_socket(raw, server_hostname=host) if tls else raw
        self.sock.settimeout(timeout)
        self.timeout = timeout
        self.engine = wire.SegmentClient()
        self.pending: deque[wire.Reply] = deque()
        self._next_request = 0

    def request_id(self) -> int:
        self._next_request += 1
        return self._next_request

    # --- raw I/O --------------------------------------------------------------------------------

    def send(self, *commands: wire.Command) -> None:
        self.sock.sendall(b"".join(self.engine.send(c) for c in commands))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float | None = None) -> wire.Reply:
        """The next reply; raises ServerClosed at EOF and TimeoutError after `timeout`."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from the segment bridge")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                raise TimeoutError("no reply from the segment bridge") from None
            except (ConnectionResetError, ssl.SSLError) as e:
                raise ServerClosed(str(e)) from None
            if not data:
                raise ServerClosed("connection closed by the server")
            self.pending.extend(self.engine.feed(data))
        return self.pending.popleft()

    def expect(self, kind: type[T], timeout: float | None = None) -> T:
        """The next reply, which must be a `kind`; KeepAlives in between are skipped."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        reply = self.recv(timeout)
        while isinstance(reply, wire.KeepAlive) and kind is not wire.KeepAlive:
            reply = self.recv(max(0.0, deadline - time.monotonic()))
        assert isinstance(reply, kind), f"expected {kind.__name__}, got {reply!r}"
        return reply

    def closed_by_server(self, timeout: float = 10.0) -> bool:
        """True once the server has closed (replies before the close are discarded)."""
        try:
            while True:
                self.recv(timeout)
        except ServerClosed:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "SegmentTestClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- protocol calls ----------------------------------------------------------------------------

    def hello(self, high: int = 15, low: int = 5) -> wire.Hello:
        self.send(wire.Hello(high, low))
        return self.expect(wire.Hello)

    def create_segment(self, segment: str) -> wire.Reply:
        self.send(wire.CreateSegment(self.request_id(), segment, 0, 0, ""))
        return self.recv()

    def setup_append(self, writer: uuid.UUID, segment: str) -> wire.Reply:
        self.send(wire.SetupAppend(self.request_id(), writer, segment, ""))
        return self.recv()

    def append(
        self, writer: uuid.UUID, payloads: Sequence[bytes], last_event_number: int, *,
        split_at: int | None = None, padding: int | None = None, request_id: int | None = None,
    ) -> int:
        """Send one append (no wait); returns its request id."""
        rid = self.request_id() if request_id is None else request_id
        self.send_raw(self.engine.append(writer, payloads, last_event_number, rid, split_at=split_at, padding=padding))
        return rid

    def read(self, segment: str, offset: int, length: int = 1 << 20) -> wire.Reply:
        self.send(wire.ReadSegment(segment, offset, length, "", self.request_id()))
        return self.recv()

    def info(self, segment: str) -> wire.Reply:
        self.send(wire.GetStreamSegmentInfo(self.request_id(), segment, ""))
        return self.recv()

    def read_all(self, segment: str) -> list[bytes]:
        """Every event payload in the segment, reading from offset 0 to the tail."""
        offset, buf, out = 0, b"", []
        while True:
            reply = self.read(segment, offset)
            assert isinstance(reply, wire.SegmentRead), reply
            buf += reply.data
            offset += len(reply.data)
            events, used = wire.split_events(buf)
            out.extend(p for _, p in events)
            buf = buf[used:]
            if reply.at_tail:
                assert not buf, "segment ends in a torn event"
                return out
