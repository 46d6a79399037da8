"""`DeviceLink`: the bridge's DEALER connection to its device(s), with pipelined requests.

Every event goes to the device as a Logjam request; `publish()` returns only when
the device has answered "202 Accepted" for all of them. Replies carry no id, but a
device answers one connection in order, so each endpoint keeps a FIFO of waiting
futures. In flight is bounded process-wide; a caller that would exceed the bound
waits, which is how back-pressure reaches the clients.

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
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from logjam.message import Message

log = logging.getLogger(__name__)

ACCEPTED = b"202 Accepted"


class DeviceRejected(Exception):
    """The device answered "400 Bad Request" for some of the messages."""

    def __init__(self, rejected: int, total: int) -> None:
        super().__init__(f"device rejected {rejected} of {total} messages")
        self.rejected = rejected
        self.total = total


class _Request:
    __slots__ = ("frames", "future")

    def __init__(self, frames: list[bytes], future: asyncio.Future[bool]) -> None:
        self.frames = frames
        self.future = future


class _Endpoint:
    """One device: a DEALER socket, its FIFO of unanswered requests, and a reader task."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, sndhwm: int) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.sndhwm = sndhwm
        self.pending: deque[_Request] = deque()
        self.resets = 0
        # Sends and FIFO appends must happen in the same order, even when a send waits on HWM.
        self._lock = asyncio.Lock()
        self._open()

    def _open(self) -> None:
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, self.sndhwm)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.sock.connect(self.endpoint)

    async def send(self, reqs: Sequence[_Request]) -> None:
        async with self._lock:
            for req in reqs:
                self.pending.append(req)
                sock = self.sock
                try:
                    await sock.send_multipart(req.frames, copy=False)
                except (zmq.ZMQError, asyncio.CancelledError):
                    if not self._swapped_out(sock):
                        raise
                    # reset() swapped sockets while we waited; it resends this request
                    # with the other unanswered ones, and the rest go out on the new socket.

    def _swapped_out(self, sock: zmq.asyncio.Socket) -> bool:
        """True when `sock` failed only because reset() closed it (pyzmq cancels its waiters)."""
        task = asyncio.current_task()
        return sock is not self.sock and sock is not self.monitor and not (task is not None and task.cancelling())

    async def read_replies(self) -> None:
        while True:
            sock = self.sock
            try:
                frames = await sock.recv_multipart()
            except (zmq.ZMQError, asyncio.CancelledError):
                if self._swapped_out(sock):
                    continue
                raise
            if len(frames) != 2 or not self.pending:
                log.warning("unexpected reply from %s: %r", self.endpoint, frames[:2])
                continue
            req = self.pending.popleft()
            if not req.future.done():
                req.future.set_result(frames[1] == ACCEPTED)

    async def watch_disconnects(self) -> None:
        while True:
            monitor = self.monitor
            try:
                event = parse_monitor_message(await monitor.recv_multipart())
            except (zmq.ZMQError, asyncio.CancelledError):
                if self._swapped_out(monitor):
                    continue
                raise
            if event["event"] == zmq.EVENT_DISCONNECTED and self.pending:
                await self.reset()

    async def reset(self) -> None:
        """Replace the socket and resend every unanswered request, in order."""
        self.resets += 1
        unanswered = [r for r in self.pending if not r.future.done()]
        log.warning("lost connection to %s with %d unanswered requests; resending", self.endpoint, len(unanswered))
        old, old_monitor = self.sock, self.monitor
        self.pending = deque()
        self._open()
        old.disable_monitor()
        old_monitor.close()
        old.close()
        await self.send(unanswered)

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close()
        self.sock.close()


class DeviceLink:
    def __init__(self, endpoints: Sequence[str], *, max_inflight: int = 20_000, sndhwm: int = 100_000) -> None:
        if not endpoints:
            raise ValueError("at least one device endpoint is required")
        self._ctx = zmq.asyncio.Context()
        self._endpoints = [_Endpoint(self._ctx, ep, sndhwm) for ep in endpoints]
        self._next = itertools.cycle(self._endpoints)
        self._max_inflight = max_inflight
        self._inflight = 0
        self._room = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for ep in self._endpoints:
            self._tasks.append(asyncio.create_task(ep.read_replies(), name=f"replies {ep.endpoint}"))
            self._tasks.append(asyncio.create_task(ep.watch_disconnects(), name=f"monitor {ep.endpoint}"))

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
        n = len(messages)
        # A batch larger than the whole bound still goes through, alone.
        need = min(n, self._max_inflight)
        async with self._room:
            await self._room.wait_for(lambda: self._inflight + need <= self._max_inflight)
            self._inflight += need
        try:
            loop = asyncio.get_running_loop()
            endpoint = next(self._next)
            reqs = [_Request([b"", *msg.to_frames()], loop.create_future()) for msg in messages]
            await endpoint.send(reqs)
            results = await asyncio.gather(*(r.future for r in reqs))
        finally:
            async with self._room:
                self._inflight -= need
                self._room.notify_all()
        rejected = n - sum(results)
        if rejected:
            raise DeviceRejected(rejected, n)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for ep in self._endpoints:
            ep.close()
        self._ctx.term()
