"""`DeviceLink`: the bridge's DEALER connection to its device(s), with pipelined requests.

Every event goes to the device as a Logjam request; `publish()` returns only when
the device has answered "202 Accepted" for all of them. Replies carry no id, but a
device answers one connection in order, so each endpoint keeps, in send order, the
batches it has not had every reply for. In flight is bounded process-wide; a caller
that would exceed the bound waits, which is how back-pressure reaches the clients.

Speed: batches travel as `MessageBatch` columns, and the frames are sent and the
replies read a whole batch per call by `native_link` (C, with a Python fallback),
from a plain ZeroMQ socket driven by the event loop: sends never block (at the
high-water mark the rest waits for the socket's FD), replies are drained when the
edge-triggered FD fires.

When the connection to a device drops (the device was killed or restarted), the
requests it had not answered are sent again on a fresh socket: the device may have
journaled some of them before dying, so delivery to the device is at-least-once, and
the body's `@metadata._id` (the same bytes on every resend) lets the importer drop
the second copy. A device that is merely slow or paused keeps its TCP connection and
is waited for.

With several devices, each publish() goes to one device, its connection's home (below),
or, without one, the next connected device in turn (ZeroMQ's DEALER round-robin, but per
call, so a batch stays on one device). Unanswered requests
stay with the device they were sent to and are resent only to it, never to another:
its journal settles whether it had them, and both copies meet in the one importer that
owns that device, where the key drops the second. Sent to another device, the copy
would land through another importer that cannot know the key. New calls skip devices
whose connection is down, so the others carry the traffic meanwhile.

A device that is stopped (a hung disk, a paused VM, SIGSTOP) keeps its connection, so
"down" does not see it. A device with requests outstanding and no reply for `deadline`
seconds (--device-deadline; any reply is progress) is marked hung: it gets no new
calls until it answers again, which the requests it holds make it do once it resumes.
One that is owed nothing is pinged every half deadline on a socket of its own (replies
carry no id, so a pong must not be counted as a request's reply), so its hang is seen
before a call waits on it.
What it holds waits for it (see above: sent elsewhere, it would be doubled). So that a
hang stalls only the connections whose batches are on it, a connection's calls stay on
one device: `affinity()` gives each connection a home, the device with the fewest homed
connections when it starts; its calls go there while it is up and answering, and
round-robin over the others while it is not (each such call is counted as rerouted).
A client that resends on a new connection after the old one died (a bridge restart) is
homed where the first copy went (`rehome()`, bridges/host/homes.py), so the copies still
meet in one importer.
Calls without an affinity go round-robin over the devices that are up and answering.
docs/reliability.md "A hung device" has the consequences.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import weakref
from collections import deque
from typing import Any, Callable, Sequence

import zmq
from zmq.utils.monitor import parse_monitor_message

from bridges.host.homes import BatchHomes, device_tag
from bridges.host.native_link import ACCEPTED, OK, UNEXPECTED, NativeWire, PyWire, wire
from logjam.curve import ClientKey, connect
from logjam.errors import DeviceRejected
from logjam.message import Message, MessageBatch, ping_request

__all__ = ["ACCEPTED", "Affinity", "DeviceLink", "DeviceRejected"]

log = logging.getLogger(__name__)

_POLLIN = zmq.POLLIN
_REFUSED = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
DEFAULT_DEADLINE_S = 5.0


class _Call:
    """One publish() call: resolved when every message of its batches has its reply."""

    __slots__ = ("remaining", "rejected", "future")

    def __init__(self, n: int, future: asyncio.Future[None]) -> None:
        self.remaining = n
        self.rejected = 0
        self.future = future


class _Part:
    """One MessageBatch in flight on one endpoint: how much of it was sent, and answered."""

    __slots__ = ("app", "topic", "compression", "columns", "n", "sent", "answered", "call")

    def __init__(self, batch: MessageBatch, columns: Any, call: _Call) -> None:
        self.app = batch.app_env.encode()
        self.topic = batch.topic.encode()
        self.compression = batch.compression
        self.columns = columns
        self.n = len(batch)
        self.sent = 0
        self.answered = 0
        self.call = call


class _Endpoint:
    """One device: a DEALER socket, what it sent (awaiting replies) and what waits to be sent."""

    def __init__(self, ctx: zmq.Context, endpoint: str, sndhwm: int, loop: asyncio.AbstractEventLoop,
                 wire_: NativeWire | PyWire, curve: ClientKey | None = None) -> None:
        self.ctx = ctx
        self.curve = curve
        self.endpoint = endpoint
        self.tag = device_tag(endpoint)  # its name in the homes ring (bridges/host/homes.py)
        self.sndhwm = sndhwm
        self.loop = loop
        self.wire = wire_
        self.parts: deque[_Part] = deque()  # not fully answered, in send order
        self.unsent: deque[_Part] = deque()  # not fully sent, in send order
        self.resets = 0
        self.refused_logged = False
        self._check_scheduled = False
        # Liveness: when the device last answered (or began to owe an answer), since when it is
        # hung (None: it is not), and the ping an idle device is asked on its own socket.
        self.progress_at = time.monotonic()
        self.hung_since: float | None = None
        self.ping_at: float | None = None  # the oldest unanswered ping
        self.pinged_at = 0.0
        self.probe = ctx.socket(zmq.DEALER)
        self.probe.setsockopt(zmq.LINGER, 0)
        self.probe.setsockopt(zmq.SNDHWM, 4)
        connect(self.probe, endpoint, curve)
        self.homes: weakref.WeakSet[Affinity] = weakref.WeakSet()  # connections whose calls come here
        self.inflight = 0  # events of calls sent here and not yet answered (DeviceLink's bound)
        self._open()

    def _open(self) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.sndhwm)
        sock.setsockopt(zmq.RCVHWM, 0)
        # The ZMTP handshake with the device succeeded (the monitor says so), not merely TCP: with
        # CURVE a TCP connection the device refuses is not a link. For /healthz.
        self.connected = False
        self.monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | _REFUSED)
        connect(sock, self.endpoint, self.curve)
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

    @property
    def usable(self) -> bool:
        """Up and answering: new calls may come here."""
        return self.connected and self.hung_since is None

    @property
    def owes(self) -> bool:
        return bool(self.parts) or self.ping_at is not None

    def submit(self, parts: list[_Part]) -> None:
        if not self.owes:
            self.progress_at = time.monotonic()  # the deadline runs from the first request it owes
        self.parts.extend(parts)
        self.unsent.extend(parts)
        self._flush()
        self._schedule_check()

    def _flush(self) -> None:
        unsent, sock, send = self.unsent, self.sock, self.wire.send
        while unsent:
            p = unsent[0]
            p.sent += send(sock, p.app, p.topic, p.compression, p.columns, p.sent, p.n)
            if p.sent < p.n:
                return  # HWM: the FD fires when there is room again
            unsent.popleft()

    def _schedule_check(self) -> None:
        # The ZeroMQ FD is edge-triggered and may not fire again for replies that
        # arrived while we were sending, so look once more after every submit.
        if not self._check_scheduled:
            self._check_scheduled = True
            self.loop.call_soon(self._on_socket)

    def _on_socket(self) -> None:
        self._check_scheduled = False
        sock = self.sock
        if sock.closed:
            return
        while True:
            n, statuses = self.wire.drain(sock)
            if not n:
                break
            if statuses is None:
                self._answered(n, 0)
            else:
                self._answered_each(statuses)
        if self.unsent:
            self._flush()
        if sock.getsockopt(zmq.EVENTS) & _POLLIN:
            self._schedule_check()

    def _answered(self, n: int, rejected: int) -> None:
        """`n` replies arrived, `rejected` of them refusals, all for the oldest sent messages."""
        self.progress_at = time.monotonic()
        if self.hung_since is not None:
            self._answering()
        parts = self.parts
        while n:
            if not parts or parts[0].answered == parts[0].sent:
                log.warning("%d replies from %s for requests never sent", n, self.endpoint)
                return
            p = parts[0]
            k = min(n, p.sent - p.answered)
            p.answered += k
            n -= k
            call = p.call
            call.remaining -= k
            if rejected:
                call.rejected += rejected
                rejected = 0
            if p.answered == p.n:
                parts.popleft()
            if call.remaining <= 0 and not call.future.done():
                call.future.set_result(None)

    def _answered_each(self, statuses: bytes) -> None:
        for s in statuses:
            if s == UNEXPECTED:
                log.warning("unexpected reply from %s", self.endpoint)
            else:
                self._answered(1, 0 if s == OK else 1)

    def check_deadline(self, now: float, deadline: float) -> bool:
        """Read pongs, ping an idle device, and mark it hung when it owes replies (or a pong) and gave
        none for `deadline` s; True if it just was."""
        self._read_pongs()
        if self.connected and not self.parts and now - max(self.progress_at, self.pinged_at) >= deadline / 2:
            # Idle, or a ping lost with a connection: ask (again). Replies carry no id on the data
            # socket, so the ping has its own.
            try:
                self.probe.send_multipart(ping_request(), zmq.NOBLOCK)
                self.pinged_at = now
                if self.ping_at is None:
                    self.ping_at = self.progress_at = now
            except zmq.Again:
                pass
        if self.hung_since is not None or not self.owes or now - self.progress_at < deadline:
            return False
        self.hung_since = self.progress_at
        owed = sum(p.sent - p.answered for p in self.parts)
        log.warning("the device at %s owes %d replies%s and answered none for %.1f s (--device-deadline): "
                    "hung; no new batches go to it until it answers", self.endpoint, owed,
                    " and a ping" if self.ping_at is not None else "", now - self.progress_at)
        return True

    def _read_pongs(self) -> None:
        answered = False
        while True:
            try:
                self.probe.recv_multipart(zmq.NOBLOCK)  # any answer shows it alive, even a refusal
            except zmq.Again:
                break
            answered = True
        if answered:
            self.ping_at = None
            self.progress_at = time.monotonic()
            if self.hung_since is not None:
                self._answering()

    def _answering(self) -> None:
        assert self.hung_since is not None
        log.warning("the device at %s answers again after %.1f s; it takes new batches again",
                    self.endpoint, time.monotonic() - self.hung_since)
        self.hung_since = None

    def _on_monitor(self) -> None:
        if self.monitor.closed:
            return
        while True:
            try:
                event = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = True
                self.progress_at, self.ping_at = time.monotonic(), None  # a fresh connection, a fresh deadline
                self.refused_logged = False
                continue
            if event["event"] & _REFUSED:
                if event["event"] != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and not self.refused_logged:
                    log.warning("the device at %s refused the handshake (CURVE key not on its allowlist, another "
                                "server key, or --plaintext against a CURVE device?)", self.endpoint)
                    self.refused_logged = True
                self.connected = False
                continue
            self.connected = False
            if event["event"] == zmq.EVENT_DISCONNECTED and self.parts:
                self.reset()
                return

    def reset(self) -> None:
        """Replace the socket and send every unanswered request again, in order."""
        self.resets += 1
        live = [p for p in self.parts if not p.call.future.done()]
        for p in live:
            p.sent = p.answered
        unanswered = sum(p.n - p.answered for p in live)
        log.warning("lost connection to %s with %d unanswered requests; resending", self.endpoint, unanswered)
        # A fresh connection gets a fresh deadline; until it is up, it takes no new calls anyway.
        self.hung_since = None
        self.progress_at = time.monotonic()
        self._close_sockets()
        self.parts, self.unsent = deque(live), deque(live)
        self._open()
        self._flush()
        self._schedule_check()

    def close(self) -> None:
        self._close_sockets()
        self.probe.close()


class Affinity:
    """One connection's home device (`DeviceLink.affinity()`); give it to every publish() of the connection."""

    __slots__ = ("home", "resend", "__weakref__")

    def __init__(self, home: _Endpoint) -> None:
        self.home = home
        # Moved by rehome(): until the device answers a call of it, its calls wait for the home
        # (not connected yet after our restart, or restarting itself) rather than go elsewhere.
        self.resend = False
        home.homes.add(self)

    def release(self) -> None:
        """The connection ended: no longer counted at home (the weak set would, once it is collected)."""
        self.home.homes.discard(self)

    def move(self, home: _Endpoint) -> None:
        self.home.homes.discard(self)
        self.home = home
        self.resend = True
        home.homes.add(self)


class DeviceLink:
    def __init__(self, endpoints: Sequence[str], *, max_inflight: int = 20_000, sndhwm: int = 100_000,
                 native: bool = True, curve: ClientKey | None = None, deadline: float = DEFAULT_DEADLINE_S,
                 on_reroute: Callable[[str], None] | None = None, batch_homes: BatchHomes | None = None) -> None:
        if not endpoints:
            raise ValueError("at least one device endpoint is required")
        self._endpoint_names = list(endpoints)
        self._sndhwm = sndhwm
        self._native = native
        self._curve = curve  # None: plaintext, to a device run with --allow-plaintext
        self._ctx: zmq.Context | None = None
        self._endpoints: list[_Endpoint] = []
        self._max_inflight = max_inflight
        self._inflight = 0
        self._room: asyncio.Condition | None = None
        if deadline <= 0:
            raise ValueError("the device deadline must be positive")
        self._deadline = deadline  # --device-deadline
        self._watch: asyncio.TimerHandle | None = None
        self._on_reroute = on_reroute  # called with "hung" or "down" for each call sent away from its device
        self.batch_homes = batch_homes if batch_homes is not None else BatchHomes(slots=4096)  # where recent batches went

    def start(self) -> None:
        """Open the sockets; call from inside the running event loop."""
        loop = asyncio.get_running_loop()
        self._wire = wire(self._native)
        self._ctx = zmq.Context()
        self._endpoints = [_Endpoint(self._ctx, ep, self._sndhwm, loop, self._wire, self._curve) for ep in self._endpoint_names]
        self._next = itertools.cycle(self._endpoints)
        self._room = asyncio.Condition()
        self._watch = loop.call_later(self._watch_interval, self._check_deadlines)

    @property
    def _watch_interval(self) -> float:
        return min(0.5, self._deadline / 4)

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        freed = False
        for ep in self._endpoints:
            freed |= ep.check_deadline(now, self._deadline) and ep.inflight > 0
        if freed:
            asyncio.ensure_future(self._notify_room())
        self._watch = asyncio.get_running_loop().call_later(self._watch_interval, self._check_deadlines)

    @property
    def native(self) -> bool:
        return isinstance(self._wire, NativeWire)

    @property
    def inflight(self) -> int:
        """Events awaiting a device, against --max-inflight. What waits on a hung device is not
        counted while another device answers: it must not take the bound from the connections of
        the devices that do (the protocols' own budgets still bound it). With none answering, all
        of it counts: back-pressure stops the clients rather than buffering for nothing."""
        if not any(ep.usable for ep in self._endpoints):
            return self._inflight
        return self._inflight - sum(ep.inflight for ep in self._endpoints if ep.hung_since is not None)

    @property
    def max_inflight(self) -> int:
        """The process-wide bound on events awaiting the device (--max-inflight)."""
        return self._max_inflight

    @property
    def connected(self) -> dict[str, bool]:
        """Endpoint -> whether its handshake with the device succeeded and it has not dropped since."""
        return {ep.endpoint: ep.connected for ep in self._endpoints}

    @property
    def hung(self) -> dict[str, float]:
        """Endpoint -> seconds since it last answered, for each device marked hung (--device-deadline)."""
        now = time.monotonic()
        return {ep.endpoint: now - ep.hung_since for ep in self._endpoints if ep.hung_since is not None}

    @property
    def resets(self) -> int:
        return sum(ep.resets for ep in self._endpoints)

    def affinity(self) -> Affinity:
        """A home device for a new connection: of the usable ones, the one with the fewest homed
        connections (the next in turn on a tie); of all of them, when none is usable."""
        assert self._endpoints, "DeviceLink.start() was not called"
        candidates = [ep for ep in self._endpoints if ep.usable] or self._endpoints
        fewest = min(len(ep.homes) for ep in candidates)
        for _ in range(len(self._endpoints)):
            ep = next(self._next)
            if ep in candidates and len(ep.homes) == fewest:
                return Affinity(ep)
        return Affinity(candidates[0])

    def rehome(self, affinity: Affinity, key: bytes) -> bool:
        """Home a new connection where the batch starting with `key` went, when one did: its
        client is sending again what a dead connection left unacknowledged (bridges/host/homes.py)."""
        tag = self.batch_homes.home_of(key)
        home = next((ep for ep in self._endpoints if ep.tag == tag), None)
        if home is None or home is affinity.home:
            return False
        affinity.move(home)
        return True

    async def publish(self, batches: Sequence[MessageBatch] | Sequence[Message], affinity: Affinity | None = None,
                      key: bytes | None = None) -> None:
        """Return once the device accepted every message; raise DeviceRejected if it refused any.
        With `affinity`, the messages go to its home device unless that one is down or hung.
        `key` fingerprints the batch's first event: where the batch goes is remembered under it."""
        if batches and isinstance(batches[0], Message):
            batches = MessageBatch.group(batches)  # type: ignore[arg-type]
        n = sum(len(b) for b in batches)
        if not n:
            return
        assert self._room is not None, "DeviceLink.start() was not called"
        # A batch larger than the whole bound still goes through, alone.
        need = min(n, self._max_inflight)
        if self.inflight + need > self._max_inflight:
            async with self._room:
                await self._room.wait_for(lambda: self.inflight + need <= self._max_inflight)
        self._inflight += need
        ep = None
        try:
            call = _Call(n, asyncio.get_running_loop().create_future())
            prepare = self._wire.prepare
            parts = [_Part(b, prepare(b), call) for b in batches if len(b)]  # type: ignore[arg-type]
            ep = self._pick(affinity)
            if key is not None:
                self.batch_homes.remember(key, ep.tag)
            ep.inflight += need
            ep.submit(parts)
            await call.future
            if affinity is not None:
                affinity.resend = False
        finally:
            self._inflight -= need
            if ep is not None:
                ep.inflight -= need
            await self._notify_room()
        if call.rejected:
            raise DeviceRejected(call.rejected, n)

    async def _notify_room(self) -> None:
        assert self._room is not None
        async with self._room:
            self._room.notify_all()

    def _pick(self, affinity: Affinity | None) -> _Endpoint:
        """The affinity's home while it is usable (a resend's home unless it is hung: it waits for a
        connection); without one, the endpoint whose turn it is while usable. Else the next usable endpoint after that one (the call is counted as rerouted); when
        none is usable, the home or the one whose turn it is: it may come back."""
        first = affinity.home if affinity is not None else next(self._next)
        if first.usable or (affinity is not None and affinity.resend and first.hung_since is None):
            return first
        eps = self._endpoints
        k = eps.index(first)
        chosen = next((ep for ep in eps[k + 1:] + eps[:k] if ep.usable), None)
        if chosen is None:
            return first
        if self._on_reroute is not None:
            self._on_reroute("hung" if first.connected else "down")
        return chosen

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        for ep in self._endpoints:
            ep.close()
        if self._ctx is not None:
            self._ctx.term()
