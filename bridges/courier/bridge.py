"""`logjam-bridge courier`: the asyncio session glue between Log Courier clients and a device.

Bytes from the client go through the sans-IO `CourierServer`; each event becomes a
Logjam message (the event object as is, plus `@metadata` with the payload's nonce
and the event's index) and is published to the device in pipelined batches.

Acknowledgement follows the delivery rule every bridge follows: an ACKN for a
payload never covers an event the device has not accepted. The host's `Pipeline` settles
batches in the order they were sent, so a payload's count only ever grows over a prefix
of its events, and only the oldest unfinished payload is ever acknowledged, so ACKNs go
out in payload order. A timer sends a partial ACKN for that payload every
`--keepalive-interval` seconds (Courier clients give up after 15 s without one), including
while the device is slow or paused and this session has stopped reading.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from bridges.courier.engine import CourierServer
from bridges.courier.messages import (
    Ack,
    EventReceived,
    Hello,
    PayloadEnded,
    PayloadStarted,
    Ping,
    Pong,
    Unknown,
    UnknownMessage,
    Version,
)
from bridges.courier.wire import (
    DEFAULT_MAX_DECOMPRESSED,
    DEFAULT_MAX_EVENT,
    DEFAULT_MAX_MESSAGE,
    DEFAULT_MAX_PAYLOAD_EVENTS,
)
from bridges.host import Batches, BridgeProtocol, Connection, KeepaliveTimer, Positions
from bridges.host.config import HostConfig, Knobs
from bridges.host.session import PipelineSession
from logjam import defaults
from runtime.config import from_flags

log = logging.getLogger("logjam-bridge.courier")


class _Payload:
    """One JDAT/EVNT payload awaiting its final ACKN."""

    __slots__ = ("nonce", "total", "accepted", "open")

    def __init__(self, nonce: bytes) -> None:
        self.nonce = nonce
        self.total: int | None = None  # known once the payload ended
        self.accepted = 0  # events the device accepted, a prefix of the payload
        self.open = 0  # its batches still at the device

    @property
    def finished(self) -> bool:
        return self.total is not None and not self.open


@dataclass(frozen=True, slots=True)
class CourierConfig:
    """The flags `Bridge.add_arguments` adds (their help text is there)."""

    max_event_size: int
    max_decompressed: int
    max_payload_events: int

    @classmethod
    def from_flags(cls, args: argparse.Namespace, host: HostConfig) -> "CourierConfig":
        return from_flags(cls, args)


class Bridge(BridgeProtocol):
    name = "courier"
    default_port = defaults.BRIDGE_PORTS["courier"]
    default_max_frame = DEFAULT_MAX_MESSAGE
    default_idle_timeout = 1800.0
    Config = CourierConfig
    # The keepalive is a partial ACKN; clients give up after 15 s without one.
    knobs = Knobs(pipeline_depth=16, batch_size=256, keepalive_interval=2.0, max_keepalive_interval=5.0,
                  renamed=(("max_pending_batches", "pipeline_depth"), ("ack_interval", "keepalive_interval")))

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("courier")
        g.add_argument("--max-event-size", type=int, default=DEFAULT_MAX_EVENT, metavar="BYTES",
                       help="largest single event (default %(default)s)")
        g.add_argument("--max-decompressed", type=int, default=DEFAULT_MAX_DECOMPRESSED, metavar="BYTES",
                       help="largest inflated size of one payload (default %(default)s)")
        g.add_argument("--max-payload-events", type=int, default=DEFAULT_MAX_PAYLOAD_EVENTS, metavar="N",
                       help="most events one JDAT/EVNT payload may hold (default %(default)s)")

    async def serve(self, conn: Connection) -> None:
        await _Session(self, conn).run()


class _Session(PipelineSession[tuple[_Payload, int]]):
    def __init__(self, bridge: Bridge, conn: Connection) -> None:
        config: CourierConfig = bridge.config
        host = bridge.host
        # With --pipeline-depth batches at the device, or the process's inflate budget spent,
        # this session stops reading its client (the engine inflates lazily, so it stops too).
        super().__init__(
            host, conn,
            CourierServer(
                max_message=host.config.max_frame_size,
                max_event=config.max_event_size,
                max_decompressed=config.max_decompressed,
                max_events=config.max_payload_events,
            ),
            name="courier", depth=host.config.pipeline_depth,
            # Courier has no way to say so but closing; nothing of the payload is acked.
            consequence="closing without acking them",
        )
        self.batch_size = host.config.batch_size
        self.mapper = host.mapper
        self.metrics = host.metrics
        self.pending: deque[_Payload] = deque()
        self.keepalive = KeepaliveTimer(conn, host.config.keepalive_interval, self._still_working)
        self.batch: Batches = self.mapper.batches()
        self.run_bodies: list[dict[str, Any]] = []
        self.run_raws: list[bytes | None] = []
        self.run_index: list[int] = []
        self.batch_payload: _Payload | None = None
        self.base_meta: dict[str, Any] = {}
        self.nonce_hex = ""

    # -- main loop --------------------------------------------------------------
    async def run(self) -> None:
        keepalive = self.keepalive.start(f"courier acks {self.conn.peer}")
        try:
            # A ProtocolError propagates: the host logs and counts it, and Courier's answer
            # to bad data is the close (nothing of the payload is acked, so nothing is lost).
            await self.read_loop()
            # EOF or shutdown: finish what was forwarded, ack it, then close.
            await self._flush()
            await self.pipeline.finish()
            self._check_failure()
            self._advance()
            self._partial_ack()
            await self.conn.drain()
        finally:
            keepalive.cancel()
            await asyncio.gather(keepalive, return_exceptions=True)
            await self.pipeline.close()

    def waiting(self) -> bool:
        return bool(self.pending)  # the client is waiting for our acks, not idle

    async def on_events(self, events: list[Any]) -> None:
        for ev in events:
            if type(ev) is EventReceived:
                self._add_event(ev)
                if self.batch.n + len(self.run_raws) >= self.batch_size:
                    await self._flush()
            else:
                await self._on_control(ev)

    async def after_read(self) -> None:
        # Don't hold events while waiting for more bytes of a slow stream.
        await self._flush()
        await self.conn.drain()

    async def _on_control(self, ev: object) -> None:
        if isinstance(ev, PayloadStarted):
            payload = _Payload(ev.nonce)
            self.pending.append(payload)
            self.batch_payload = payload
            hs = self.engine.handshake
            self.base_meta = self.conn.metadata("1" if hs is None else "2")
            if hs is not None:
                self.base_meta["client"] = hs.describe()
            self.nonce_hex = ev.nonce.hex()
        elif isinstance(ev, PayloadEnded):
            await self._flush()
            payload = self.pending[-1]
            payload.total = ev.count
            self._advance()
        elif isinstance(ev, Hello):
            log.debug("%s: HELO from %s", self.conn.peer, ev.handshake.describe())
            self.conn.write(self.engine.send(Version()))
        elif isinstance(ev, Ping):
            self.conn.write(self.engine.send(Pong()))
        elif isinstance(ev, UnknownMessage):
            log.info("%s: unknown message type %r (%d bytes); answered ????", self.conn.peer, ev.type, ev.length)
            self.metrics.protocol_error("unknown_message")
            self.conn.write(self.engine.send(Unknown()))

    def _add_event(self, ev: EventReceived) -> None:
        # Mapped as one run when the batch is sent: the engine parsed the event already
        # (`raw` is its text when `body` is that object), and the run's @metadata is
        # encoded once.
        self.run_bodies.append(ev.body)
        self.run_raws.append(ev.raw)
        self.run_index.append(ev.index)

    def _end_run(self) -> None:
        if self.run_raws:
            self.mapper.add_payloads(self.batch, self.run_raws, {**self.base_meta, "nonce": self.nonce_hex},
                                     Positions("index", self.run_index), bodies=self.run_bodies,
                                     created_ms=self.base_meta["received_at"])
            self.run_bodies, self.run_raws, self.run_index = [], [], []

    # -- device side -------------------------------------------------------------
    async def _flush(self) -> None:
        self._end_run()
        if not self.batch:
            return
        messages, self.batch = self.batch, self.mapper.batches()
        payload = self.batch_payload
        assert payload is not None
        n = len(messages)
        self.metrics.events_received.inc(n)
        pipeline = self.pipeline
        # With the inflated bytes these events came from, until the device answered.
        self.take(n)
        await pipeline.slot()
        if pipeline.failed:
            return
        payload.open += 1
        # A payload is resent whole, with its nonce, on a new connection: that homes it (bridges/host/homes.py).
        pipeline.launch((payload, n), batches=messages, units=n, events=n, key=payload.nonce)
        await pipeline.room()

    def accepted(self, plan: tuple[_Payload, int]) -> None:
        payload, n = plan
        payload.accepted += n
        payload.open -= 1
        self._advance()

    def _check_failure(self) -> None:
        if self.failure is not None:
            raise self.failure

    # -- acks ---------------------------------------------------------------------
    def _advance(self) -> None:
        """Send the final ACKN of every finished payload at the head, in order."""
        if self.failure is not None:
            return
        pending = self.pending
        while pending and pending[0].finished:
            head = pending.popleft()
            self.conn.write(self.engine.send(Ack(head.nonce, head.accepted)))

    def _head_ack(self) -> bytes | None:
        if self.failure is not None or not self.pending:
            return None
        head = self.pending[0]
        return self.engine.send(Ack(head.nonce, head.accepted))

    def _partial_ack(self) -> None:
        ack = self._head_ack()
        if ack is not None:
            self.conn.write(ack)

    def _still_working(self) -> bytes | None:
        self._advance()
        return self._head_ack()
