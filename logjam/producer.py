"""`Producer`: the client side of the Logjam producer protocol (DEALER or PUSH).

DEALER mode sends requests (an empty frame first) and counts the 202/400 replies.
Replies carry no id, only the app-env, but a device answers one connection in
order, so the producer needs only the number outstanding. Many requests may be in
flight; `flush()` waits for all of them. PUSH mode is fire and forget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import zmq

from logjam import sockets
from logjam.constants import ACCEPTED, PONG
from logjam.curve import ClientKey, connect
from logjam.message import Message, ping_request
from logjam.meta import Compression

# Ruby and Java clients keep sequence numbers in a signed 64-bit integer, and so does
# Spark; wrapping at 2**63 - 1 keeps every consumer's arithmetic exact.
SEQ_WRAP = 2**63 - 1



class ReplyTimeout(TimeoutError):
    """The device did not answer every outstanding request in time."""


@dataclass(frozen=True, slots=True)
class FlushResult:
    accepted: int
    rejected: int


class Producer:
    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        mode: str = "dealer",
        compression: int | str = Compression.NONE,
        timeout: float = 5.0,
        context: zmq.Context | None = None,
        sndhwm: int = 100_000,
        linger_ms: int = sockets.DEFAULT_LINGER_MS,
        curve: ClientKey | None = None,
    ) -> None:
        if mode not in ("dealer", "push"):
            raise ValueError(f"mode must be 'dealer' or 'push', not {mode!r}")
        self.mode = mode
        self.compression = Compression.parse(compression)
        self.timeout = timeout
        self._ctx = context or zmq.Context.instance()
        kind = zmq.DEALER if mode == "dealer" else zmq.PUSH
        # `curve`: the key to connect with (logjam.curve); None speaks plaintext, which only a
        # device run with --allow-plaintext accepts.
        self._sock = connect(sockets.socket(self._ctx, kind, linger_ms=linger_ms, sndhwm=sndhwm), endpoints, curve)
        self._seq = 0
        self._outstanding = 0
        self._accepted = 0
        self._rejected = 0
        self._pong: bytes | None = None
        self.closed = False

    def _next_seq(self) -> int:
        self._seq = 1 if self._seq >= SEQ_WRAP else self._seq + 1
        return self._seq

    def _frames(self, app_env: str, topic: str, payload: bytes | dict[str, Any], created_ms: int | None) -> list[bytes]:
        msg = Message.build(
            app_env, topic, payload, compression=self.compression,
            created_ms=created_ms, seq=self._next_seq(),
        )
        return msg.to_frames()

    def send(self, app_env: str, topic: str, payload: bytes | dict[str, Any], *, created_ms: int | None = None) -> int:
        """Send without asking for a reply. Returns the message's sequence number."""
        self._send(self._frames(app_env, topic, payload, created_ms))
        return self._seq

    def submit(self, app_env: str, topic: str, payload: bytes | dict[str, Any], *, created_ms: int | None = None) -> int:
        """Send a request (DEALER only) without waiting; `flush()` collects the replies."""
        self._require_dealer("requests")
        self._send([b""] + self._frames(app_env, topic, payload, created_ms))
        self._outstanding += 1
        self._drain(0)
        return self._seq

    def request(self, app_env: str, topic: str, payload: bytes | dict[str, Any], *, created_ms: int | None = None) -> bool:
        """Send one request and wait for its reply: True for 202, False for 400."""
        self.flush()
        self.submit(app_env, topic, payload, created_ms=created_ms)
        return self.flush().accepted == 1

    @property
    def outstanding(self) -> int:
        return self._outstanding

    def flush(self, timeout: float | None = None) -> FlushResult:
        """Wait until every outstanding request is answered; returns the counts since the last flush."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while self._outstanding:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ReplyTimeout(f"{self._outstanding} requests unanswered after {self.timeout}s")
            self._drain(remaining)
        result = FlushResult(self._accepted, self._rejected)
        self._accepted = self._rejected = 0
        return result

    def ping(self, app_env: str = "logjam-ping", timeout: float | None = None) -> str:
        """Ping the device and return its fqdn."""
        self._require_dealer("ping")
        self._pong = None
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        self._send(ping_request(app_env, self._next_seq()), deadline)
        while self._pong is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ReplyTimeout(f"no pong within {self.timeout}s")
            self._drain(remaining)
        return self._pong.decode()

    def _send(self, frames: list[bytes], deadline: float | None = None) -> None:
        """Send without blocking past the deadline (default: `timeout` from now).

        A DEALER or PUSH with no completed connection (device down, or a CURVE
        handshake it refuses) cannot queue anything, and a plain send would block forever.
        """
        try:
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            return
        except zmq.Again:
            pass
        if deadline is None:
            deadline = time.monotonic() + self.timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._sock.poll(int(remaining * 1000) + 1, zmq.POLLOUT):
                raise ReplyTimeout(f"device not reachable within {self.timeout}s (nothing could be queued)")
            try:
                self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                continue

    def _drain(self, timeout_s: float) -> None:
        """Read every reply that is ready, waiting up to `timeout_s` for the first."""
        wait_ms = int(timeout_s * 1000)
        while self._sock.poll(wait_ms, zmq.POLLIN):
            wait_ms = 0
            frames = self._sock.recv_multipart()
            if len(frames) == 3 and frames[0] == b"ping":
                if frames[1] != PONG:
                    raise ReplyTimeout(f"ping refused: {frames[1]!r}")
                self._pong = frames[2]
            elif len(frames) == 2 and frames[0] == b"ping":
                # ["ping", "400 Bad Request"]: the device could not read our ping.
                self._pong = b""
            elif len(frames) == 2:
                self._outstanding = max(0, self._outstanding - 1)
                if frames[1] == ACCEPTED:
                    self._accepted += 1
                else:
                    self._rejected += 1

    def _require_dealer(self, what: str) -> None:
        if self.mode != "dealer":
            raise ValueError(f"{what} need DEALER mode; this producer is PUSH")

    def close(self, ping: bool = True) -> None:
        """Ping first (the spec asks clients to), so everything sent has reached the device.

        `ping=False` skips it, for a device already known not to answer.
        """
        if self.closed:
            return
        self.closed = True
        try:
            if ping and self.mode == "dealer":
                try:
                    self.ping()
                except ReplyTimeout:
                    pass
        finally:
            self._sock.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
