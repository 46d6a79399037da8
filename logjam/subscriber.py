"""`Subscriber`: SUB to one or more device PUB endpoints, yielding Messages and Gaps.

Gap tracking follows the reference importer (it is on only when subscribed to every
stream: a device numbers all streams with one counter, so a prefix subscription
would see every other stream's messages as gaps): per device, gap = seq - last - 1;
device 0 is not tracked (it is the number of an unconfigured device, and several
may exist); a negative gap means the device restarted or its counter wrapped.

Each endpoint has its own SUB socket and a heartbeat credit: every message restores
it to 6, every heartbeat interval without one costs 1, and at 0 (about 30 s) the
socket is reconnected, which clears a half-open TCP connection ZeroMQ cannot see.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import zmq

from logjam import sockets
from logjam.curve import ClientKey, connect
from logjam.errors import RemoteProtocolError
from logjam.message import HEARTBEAT, Message
from logjam.raw import Drain, RawBatch

log = logging.getLogger(__name__)

FULL_CREDIT = 6


@dataclass(frozen=True, slots=True)
class Gap:
    """Messages from `device` that never arrived: sequence numbers `first`..`last`.

    `lost` < 0 marks a restart (the sequence went backwards); then first/last are the
    old and new sequence numbers and nothing is counted as lost.
    """

    device: int
    lost: int
    first: int
    last: int

    @property
    def restart(self) -> bool:
        return self.lost < 0


class _Link:
    __slots__ = ("endpoint", "sock", "credit", "drain")

    def __init__(self, endpoint: str, sock: zmq.Socket) -> None:
        self.endpoint = endpoint
        self.sock = sock
        self.credit = FULL_CREDIT
        self.drain: Drain | None = None


class GapTracker:
    """Per-device sequence bookkeeping, shared by the subscriber and the importer."""

    def __init__(self) -> None:
        self.last_seq: dict[int, int] = {}
        self.lost: dict[int, int] = {}
        self.restarts: dict[int, int] = {}

    def observe(self, device: int, seq: int) -> Gap | None:
        if device == 0:
            return None
        last = self.last_seq.get(device)
        self.last_seq[device] = seq
        if last is None:
            return None
        gap = seq - last - 1
        if gap == 0:
            return None
        if gap > 0:
            self.lost[device] = self.lost.get(device, 0) + gap
            return Gap(device, gap, last + 1, seq - 1)
        self.restarts[device] = self.restarts.get(device, 0) + 1
        return Gap(device, gap, last, seq)


class Subscriber:
    def __init__(
        self,
        endpoints: str | Sequence[str],
        app_envs: Sequence[str] = (),
        *,
        context: zmq.Context | None = None,
        heartbeat_interval: float = 5.0,
        rcvhwm: int = 100_000,
        native: bool = True,
        curve: ClientKey | None = None,
    ) -> None:
        self._ctx = context or zmq.Context.instance()
        self._prefixes = [p.encode() for p in app_envs] + [HEARTBEAT.encode()] if app_envs else [b""]
        self._rcvhwm = rcvhwm
        self._curve = curve  # None: plaintext (a device run with --allow-plaintext)
        self.native = native  # recv_raw's C drain, when it can be built
        self.heartbeat_interval = heartbeat_interval
        self.gaps: GapTracker | None = None if app_envs else GapTracker()
        self.reconnects = 0
        self.bad_messages = 0
        # Which endpoint each device's messages first arrived on: where to ask for a replay.
        self.device_endpoint: dict[int, str] = {}
        self._links = [self._open(ep) for ep in ([endpoints] if isinstance(endpoints, str) else endpoints)]
        self._poller = zmq.Poller()
        for link in self._links:
            self._poller.register(link.sock, zmq.POLLIN)
        self._by_sock = {link.sock: link for link in self._links}
        self._next_tick = time.monotonic() + heartbeat_interval
        self._pending: list[Message | Gap] = []

    def _open(self, endpoint: str) -> _Link:
        sock = sockets.socket(self._ctx, zmq.SUB, linger_ms=0, rcvhwm=self._rcvhwm)
        for prefix in self._prefixes:
            sock.setsockopt(zmq.SUBSCRIBE, prefix)
        connect(sock, endpoint, self._curve)
        return _Link(endpoint, sock)

    def _tick(self) -> None:
        now = time.monotonic()
        if now < self._next_tick:
            return
        self._next_tick = now + self.heartbeat_interval
        for link in self._links:
            link.credit -= 1
            if link.credit <= 0:
                log.warning("no traffic from %s for %d heartbeats; reconnecting", link.endpoint, FULL_CREDIT)
                link.sock.disconnect(link.endpoint)
                link.sock.connect(link.endpoint)
                link.credit = FULL_CREDIT
                self.reconnects += 1

    def _accept(self, frames: list[bytes], endpoint: str) -> None:
        try:
            msg = Message.from_frames(frames)
        except RemoteProtocolError as e:
            # The stats socket's 3-frame messages and foreign publishers end up here.
            self.bad_messages += 1
            log.debug("skipping undecodable message: %s", e)
            return
        if msg.meta.device not in self.device_endpoint:
            self.device_endpoint[msg.meta.device] = endpoint
        if self.gaps is not None:
            gap = self.gaps.observe(msg.meta.device, msg.meta.seq)
            if gap is not None:
                self._pending.append(gap)
        self._pending.append(msg)

    def _poll(self, deadline: float | None) -> dict | None:
        """Sockets with input, after at most one heartbeat interval; None once `deadline` has passed."""
        self._tick()
        wait = self.heartbeat_interval
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
            if wait <= 0:
                return None
        return dict(self._poller.poll(max(0, int(wait * 1000)) or 1))

    def recv_batch(self, max_items: int = 1000, timeout: float | None = None) -> list[Message | Gap]:
        """Up to `max_items` Messages and Gaps in arrival order; [] after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._pending:
            ready = self._poll(deadline)
            if ready is None:
                return []
            for sock in ready:
                link = self._by_sock[sock]
                link.credit = FULL_CREDIT
                for _ in range(max_items):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._accept(frames, link.endpoint)
        batch, self._pending = self._pending[:max_items], self._pending[max_items:]
        return batch

    def recv_raw(self, timeout: float | None = None) -> list[RawBatch]:
        """The waiting messages of each endpoint as columns (logjam/raw.py), without Message objects or gap
        tracking (the caller reads every message's device and seq anyway); [] after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready = self._poll(deadline)
            if ready is None:
                return []
            out = []
            for sock in ready:
                link = self._by_sock[sock]
                link.credit = FULL_CREDIT
                if link.drain is None:
                    link.drain = Drain(sock, link.endpoint, native=self.native)
                batch = link.drain.drain()
                if batch is not None:
                    out.append(batch)
            self.bad_messages = sum(link.drain.bad for link in self._links if link.drain is not None)
            if out:
                return out

    def recv(self, timeout: float | None = None) -> Message | Gap | None:
        batch = self.recv_batch(1, timeout)
        return batch[0] if batch else None

    def __iter__(self) -> Iterator[Message | Gap]:
        while True:
            yield from self.recv_batch()

    def close(self) -> None:
        for link in self._links:
            if link.drain is not None:
                link.drain.close()
            link.sock.close()

    def __enter__(self) -> "Subscriber":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
