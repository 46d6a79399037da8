"""A small Log Courier client that follows the protocol as docs/protocols/courier.md describes it.

No real Courier client can be installed here, so the tests and the benchmark use this
one. It speaks over a real TCP or TLS socket, optionally opens with HELO (and then
requires a VERS), sends JDAT or EVNT payloads pipelined, answers nothing itself, and
verifies every ACKN it receives against what a server may send:

- the nonce names a payload this connection sent and has not seen completed;
- ACKNs come in payload order: only the oldest unfinished payload is acknowledged;
- a payload's sequence never goes down and never exceeds its event count.

A background thread reads the socket, so acks are collected (with their arrival
times) while the caller is still sending. Any violation is recorded and raised by the
next call.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from bridges.courier.engine import CourierClient
from bridges.courier.messages import AckReceived, PongReceived, UnknownReceived, VersionReceived
from bridges.courier.wire import encode_evnt, encode_jdat


class CourierViolation(AssertionError):
    """The server broke the protocol as this client checks it."""


@dataclass
class Payload:
    nonce: bytes
    count: int
    sent_at: float
    acks: list[tuple[float, int]] = field(default_factory=list)
    done_at: float | None = None


class TestCourierClient:
    __test__ = False  # not a pytest class

    def __init__(
        self,
        port: int,
        *,
        host: str = "127.0.0.1",
        tls: ssl.SSLContext | None = None,
        handshake: bool = True,
        timeout: float = 30.0,
    ) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname=host)
        sock.settimeout(None)
        self.sock = sock
        self.engine = CourierClient()
        self.cond = threading.Condition()
        self.pending: deque[Payload] = deque()
        self.done: list[Payload] = []
        self.acks: list[tuple[float, bytes, int]] = []  # every ACKN: (monotonic time, nonce, seq)
        self.pongs = 0
        self.unknowns = 0
        self.version: VersionReceived | None = None
        self.closed = False
        self.error: BaseException | None = None
        self._known: set[bytes] = set()
        self._reader = threading.Thread(target=self._read, name="courier-client-reader", daemon=True)
        self._reader.start()
        if handshake:
            self.sock.sendall(self.engine.hello())
            self.wait(lambda: self.version is not None, timeout, "VERS")
            if not self.version.handshake.supports_evnt:  # type: ignore[union-attr]
                raise CourierViolation("VERS does not announce EVNT support")

    # -- reading ---------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                try:
                    data = self.sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    break
                events = self.engine.feed(data)
                now = time.monotonic()
                with self.cond:
                    for ev in events:
                        self._on(ev, now)
                    self.cond.notify_all()
        except BaseException as e:  # recorded for the test thread
            with self.cond:
                self.error = self.error or e
        finally:
            with self.cond:
                self.closed = True
                self.cond.notify_all()

    def _on(self, ev: object, now: float) -> None:
        if isinstance(ev, AckReceived):
            self.acks.append((now, ev.nonce, ev.sequence))
            if not self.pending or ev.nonce not in self._known:
                raise CourierViolation(f"ACKN for a nonce this connection has no payload for: {ev.nonce.hex()}")
            head = self.pending[0]
            if ev.nonce != head.nonce:
                raise CourierViolation(
                    f"ACKN out of order: {ev.nonce.hex()} acknowledged while {head.nonce.hex()} is unfinished"
                )
            if ev.sequence > head.count:
                raise CourierViolation(f"ACKN sequence {ev.sequence} beyond the payload's {head.count} events")
            if head.acks and ev.sequence < head.acks[-1][1]:
                raise CourierViolation(f"ACKN sequence went down: {head.acks[-1][1]} -> {ev.sequence}")
            head.acks.append((now, ev.sequence))
            if ev.sequence == head.count:
                head.done_at = now
                self.done.append(self.pending.popleft())
        elif isinstance(ev, VersionReceived):
            if self.version is not None:
                raise CourierViolation("a second VERS")
            self.version = ev
        elif isinstance(ev, PongReceived):
            self.pongs += 1
        elif isinstance(ev, UnknownReceived):
            self.unknowns += 1

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                if self.error is not None:
                    raise self.error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
                if self.closed and not predicate():
                    raise AssertionError(f"connection closed while waiting for {what}")
                self.cond.wait(min(left, 0.5))
        self.check()

    # -- sending ---------------------------------------------------------------
    def send(self, events: list[bytes], kind: str = "JDAT", nonce: bytes | None = None) -> Payload:
        """Send one payload without waiting for its ack."""
        nonce = nonce or os.urandom(16)
        wire = (encode_jdat if kind == "JDAT" else encode_evnt)(nonce, events)
        return self.send_encoded(nonce, len(events), wire)

    def send_encoded(self, nonce: bytes, count: int, wire: bytes) -> Payload:
        self.check()
        payload = Payload(nonce, count, time.monotonic())
        with self.cond:
            self.pending.append(payload)
            self._known.add(nonce)
        self.sock.sendall(wire)
        return payload

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def ping(self, timeout: float = 10.0) -> None:
        before = self.pongs
        self.sock.sendall(self.engine.ping())
        self.wait(lambda: self.pongs > before, timeout, "PONG")

    def wait_all_acked(self, timeout: float = 30.0) -> None:
        self.wait(lambda: not self.pending, timeout, f"final ACKNs ({len(self.pending)} payloads unfinished)")

    def wait_closed(self, timeout: float = 10.0) -> None:
        self.wait(lambda: self.closed, timeout, "the server to close the connection")

    def close(self) -> None:
        try:
            # shutdown() wakes the reader thread's recv(); close() alone would not.
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
        finally:
            self._reader.join(5)

    def __enter__(self) -> "TestCourierClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
