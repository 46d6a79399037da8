"""`DeviceLink`: the bridge's DEALER connection to its device(s), with pipelined requests.

Every event goes to the device as a Logjam request; `publish()` returns only when
the device has answered "202 Accepted" for all of them. Replies carry no id, but a
device answers one connection in order, so each endpoint keeps a FIFO of what it
sent. In flight is bounded process-wide; a caller that would exceed the bound waits,
which is how back-pressure reaches the clients.

Speed: a bridge's CPU goes mostly into this link, so it uses a plain ZeroMQ socket
driven from the event loop (sends with NOBLOCK, replies drained when the socket's
edge-triggered FD fires) and one future per batch, not per message.

When the connection to a device drops (the device was killed or restarted), the
requests it had not answered are sent again on a fresh socket: the device may have
published some of them before dying, so delivery to the device is at-least-once.
A device that is merely slow or paused keeps its TCP connection and is waited for.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from typing import Sequence

import zmq
from zmq.backend import Socket as _RawSocket
from zmq.utils.monitor import parse_monitor_message

from logjam.message import Message

log = logging.getLogger(__name__)

ACCEPTED = b"202 Accepted"
_NOBLOCK = zmq.NOBLOCK
_POLLIN = zmq.POLLIN
_FIRST = zmq.NOBLOCK | zmq.SNDMORE
_MORE = zmq.SNDMORE
# The backend's unbound methods: pyzmq's send_multipart wrapper (flag enums, a loop in
# Python) costs more per request than the rest of the bridge's forwarding.
_send = _RawSocket.send
_recv = _RawSocket.recv


class DeviceRejected(Exception):
    """The device answered "400 Bad Request" for some of the messages."""

    def __init__(self, rejected: int, total: int) -> None:
        super().__init__(f"device rejected {rejected} of {total} messages")
        self.rejected = rejected
        self.total = total


class _Batch:
    """One publish() call: resolved when every message has its reply."""

    __slots__ = ("remaining", "rejected", "future")

    def __init__(self, n: int, future: asyncio.Future[None]) -> None:
        self.remaining = n
        self.rejected = 0
        self.future = future


_Entry = tuple[list[bytes], _Batch]


class _Endpoint:
    """One device: a DEALER socket, what it sent (awaiting replies) and what waits to be sent."""

    def __init__(self, ctx: zmq.Context, endpoint: str, sndhwm: int, loop: asyncio.AbstractEventLoop) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.sndhwm = sndhwm
        self.loop = loop
        self.sent: deque[_Entry] = deque()
        self.backlog: deque[_Entry] = deque()
        self.resets = 0
        self._check_scheduled = False
        self._open()

    def _open(self) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.sndhwm)
        sock.setsockopt(zmq.RCVHWM, 0)
        self.monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sock.connect(self.endpoint)
        self.sock = sock
        self.loop.add_reader(sock.FD, self._on_socket)
        self.loop.add_reader(self.monitor.FD, self._on_monitor)
        # An edge-triggered FD only fires again once its pending state has been read.
        self.loop.call_soon(self._on_monitor)
        self._schedule_check()

    def _close_sockets(self) -> None:
        self.loop.remove_reader(self.sock.FD)
        self.loop.remove_reader(self.monitor.FD)
        self.sock.disable_monitor()
        self.monitor.close()
        self.sock.close()

    def submit(self, entries: list[_Entry]) -> None:
        self.backlog.extend(entries)
        self._flush()
        self._schedule_check()

    def _flush(self) -> None:
        backlog, sent, sock, send = self.backlog, self.sent, self.sock, _send
        while backlog:
            entry = backlog[0]
            empty, app, topic, body, meta = entry[0]
            try:
                send(sock, empty, _FIRST)
            except zmq.Again:
                return  # HWM: the FD fires when there is room again
            # Multipart messages are atomic: once the first part is queued, the rest is too.
            send(sock, app, _MORE)
            send(sock, topic, _MORE)
            send(sock, body, _MORE)
            send(sock, meta, 0)
            backlog.popleft()
            sent.append(entry)

    def _schedule_check(self) -> None:
        # The ZeroMQ FD is edge-triggered and may not fire again for replies that
        # arrived while we were sending, so look once more after every submit.
        if not self._check_scheduled:
            self._check_scheduled = True
            self.loop.call_soon(self._on_socket)

    def _on_socket(self) -> None:
        self._check_scheduled = False
        if self.sock.closed:
            return
        sock, sent, recv = self.sock, self.sent, _recv
        while True:
            try:
                first = recv(sock, _NOBLOCK)
            except zmq.Again:
                break
            frames = [first]
            while sock.rcvmore:
                frames.append(recv(sock))
            if len(frames) != 2 or not sent:
                log.warning("unexpected reply from %s: %r", self.endpoint, frames[:2])
                continue
            batch = sent.popleft()[1]
            if frames[1] != ACCEPTED:
                batch.rejected += 1
            batch.remaining -= 1
            if batch.remaining == 0 and not batch.future.done():
                batch.future.set_result(None)
        if self.backlog:
            self._flush()
        if sock.getsockopt(zmq.EVENTS) & _POLLIN:
            self._schedule_check()

    def _on_monitor(self) -> None:
        if self.monitor.closed:
            return
        while True:
            try:
                event = parse_monitor_message(self.monitor.recv_multipart(_NOBLOCK))
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED and (self.sent or self.backlog):
                self.reset()
                return

    def reset(self) -> None:
        """Replace the socket and send every unanswered request again, in order."""
        self.resets += 1
        unanswered = deque(e for e in self.sent if not e[1].future.done())
        unanswered.extend(self.backlog)
        log.warning("lost connection to %s with %d unanswered requests; resending", self.endpoint, len(unanswered))
        self._close_sockets()
        self.sent, self.backlog = deque(), unanswered
        self._open()
        self._flush()
        self._schedule_check()

    def close(self) -> None:
        self._close_sockets()


class DeviceLink:
    def __init__(self, endpoints: Sequence[str], *, max_inflight: int = 20_000, sndhwm: int = 100_000) -> None:
        if not endpoints:
            raise ValueError("at least one device endpoint is required")
        self._endpoint_names = list(endpoints)
        self._sndhwm = sndhwm
        self._ctx: zmq.Context | None = None
        self._endpoints: list[_Endpoint] = []
        self._max_inflight = max_inflight
        self._inflight = 0
        self._room: asyncio.Condition | None = None

    def start(self) -> None:
        """Open the sockets; call from inside the running event loop."""
        loop = asyncio.get_running_loop()
        self._ctx = zmq.Context()
        self._endpoints = [_Endpoint(self._ctx, ep, self._sndhwm, loop) for ep in self._endpoint_names]
        self._next = itertools.cycle(self._endpoints)
        self._room = asyncio.Condition()

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def resets(self) -> int:
        return sum(ep.resets for ep in self._endpoints)

    async def publish(self, messages: Sequence[Message]) -> None:
        """Return once the device accepted every message; raise DeviceRejected if it refused any."""
        if not messages:
            return
        assert self._room is not None, "DeviceLink.start() was not called"
        n = len(messages)
        # A batch larger than the whole bound still goes through, alone.
        need = min(n, self._max_inflight)
        if self._inflight + need > self._max_inflight:
            async with self._room:
                await self._room.wait_for(lambda: self._inflight + need <= self._max_inflight)
        self._inflight += need
        try:
            batch = _Batch(n, asyncio.get_running_loop().create_future())
            next(self._next).submit([([b"", *msg.to_frames()], batch) for msg in messages])
            await batch.future
        finally:
            self._inflight -= need
            async with self._room:
                self._room.notify_all()
        if batch.rejected:
            raise DeviceRejected(batch.rejected, n)

    async def close(self) -> None:
        for ep in self._endpoints:
            ep.close()
        if self._ctx is not None:
            self._ctx.term()
