"""`logjam-bridge lumberjack`: the asyncio glue between one Lumberjack client and the device.

Each connection runs one `LumberjackServer` engine and the host's `Pipeline`:
- the reader decodes frames into a queue and stops reading while the pipeline says the
  connection holds enough (the device is slow, paused or down), so memory stays flat;
- whenever the pipeline can take a batch, whatever is queued goes to the device as one
  batch and, once the device has accepted it (and everything before it), the acks it
  earned go out: the last event of each window it covered;
- the keepalive timer repeats the last ack of the pending window (or 0) while events
  wait, so clients keep waiting instead of timing out.

Acks therefore go out as soon as the device accepted what arrived, not when a window is
"full": real clients send fewer events than they announced (end of a batch), or one W
and then an endless D stream (npm lumberjack-protocol), and both must see progress.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from bridges.host import (
    Batches,
    BridgeProtocol,
    Budget,
    Connection,
    DeviceRejected,
    Host,
    IdleTimeout,
    KeepaliveTimer,
    Positions,
)
from bridges.lumberjack.engine import (
    DEFAULT_MAX_DECOMPRESSED,
    DEFAULT_MAX_FRAME,
    V1,
    Ack,
    DataFrame,
    JsonFrames,
    Keepalive,
    SEQ_MAX,
    LumberjackServer,
    WindowFrame,
)
from bridges.host.config import HostConfig, Knobs
from bridges.host.homes import client_key
from bridges.host.session import PipelineSession
from logjam import defaults
from logjam.errors import LocalProtocolError, ProtocolError
from runtime.config import from_flags

log = logging.getLogger(__name__)

FEED_SLICE = 8192

Item = DataFrame | JsonFrames | WindowFrame  # windows are queued to act on them in order


def _weight(item: Item) -> int:
    """What an item counts against the pending bounds: its events (a window counts one)."""
    return len(item) if item.__class__ is JsonFrames else 1  # type: ignore[arg-type]


def data_body(event: DataFrame) -> dict[str, Any]:
    """The Logjam body of a v1 string map (the Logstash convention)."""
    body: dict[str, Any] = {}
    for key, value in event.fields.items():
        if isinstance(value, bytes):
            body[f"{key}_base64"] = base64.b64encode(value).decode("ascii")
        else:
            body[key] = value
    # logstash-forwarder's `line` is Logstash's `message`; an explicit `message` wins.
    if "line" in body and "message" not in body:
        body["message"] = body.pop("line")
    return body


class _Acks:
    """What a batch earns once the device accepted it: the acks to write, in order."""

    __slots__ = ("acks", "first_window", "silent_after")

    def __init__(self, acks: list[Ack], first_window: int, silent_after: bool) -> None:
        self.acks = acks
        self.first_window = first_window  # the window a keepalive names while this batch waits
        self.silent_after = silent_after


class Session(PipelineSession[_Acks]):
    """One client connection."""

    # Bytes are read in up to 64 KiB but fed in small slices, checking the bounds before
    # each: well-compressed input holds thousands of events per read, and decoded events
    # cost far more memory than the compressed bytes waiting here.
    feed_slice = FEED_SLICE

    def __init__(self, bridge: "Bridge", conn: Connection) -> None:
        config: LumberjackConfig = bridge.config
        host = bridge.host
        super().__init__(
            host, conn, LumberjackServer(host.config.max_frame_size, config.max_decompressed_size),
            name="lumberjack", depth=host.config.pipeline_depth,
            max_pending=config.max_pending_events, shared=bridge.budget,
            # Lumberjack has no error reply: the client keeps the events and sends them
            # again once the cause is fixed.
            consequence="closing without ack (check --app-env/--topic)",
        )
        self.max_batch = max(1, min(host.config.batch_size, config.max_pending_events))
        # Decoded, not yet in a batch, in arrival order; `queued_items` is their weight.
        # Batches are cut only when the pipeline can take one, so they grow while the
        # device is busy, and their decoded events are dropped once mapped.
        self.queue: deque[Item] = deque()
        self.queued_items = 0
        self.keepalive = KeepaliveTimer(conn, host.config.keepalive_interval, self._still_working)
        # Inside a window of 2^32-1 the client has said it never waits for acks (stashward).
        # Like Logstash, which acks a full window, we send none there: such a client never
        # reads, and closing a socket with unread data turns its FIN into a reset that
        # discards whatever it had not yet transmitted.
        self.plan_silent = False  # as of the newest batch planned
        self.silent = False  # as of the newest batch acked

    async def run(self) -> None:
        keepalive = self.keepalive.start(f"lumberjack keepalive {self.conn.peer}")
        error: BaseException | None = None
        try:
            try:
                await self.read_loop()
            except (ProtocolError, IdleTimeout, ConnectionError, OSError) as e:
                error = e
            self._launch_ready()
            await self.pipeline.finish()  # what was read is forwarded and acked before the close
        finally:
            keepalive.cancel()
            await asyncio.gather(keepalive, return_exceptions=True)
            await self.pipeline.close()
        # A device rejection was logged and counted where it happened; the rest is the host's.
        error = error or self.failure
        if error is not None and not isinstance(error, DeviceRejected):
            raise error

    def done(self) -> bool:
        return self.conn.stopping

    def waiting(self) -> bool:
        return bool(self.pipeline.pending)  # the client is waiting for us, not idle

    async def before_feed(self) -> None:
        # Batches are cut before waiting, for the client or for room, not after every
        # slice: the events of a whole read go out together.
        if self.queue and (not self.unfed or not self.pipeline.has_room):
            self._launch_ready()
        await self.pipeline.room()

    async def after_read(self) -> None:
        """Acks are written as the device accepts batches, not drained here."""

    async def on_events(self, events: list[Item]) -> None:
        self.queue.extend(events)
        weight = sum(map(_weight, events))
        windows = sum(1 for e in events if e.__class__ is WindowFrame)
        self.queued_items += weight
        self.take(weight)
        if weight > windows:
            self.host.metrics.events_received.inc(weight - windows)

    def _launch_ready(self) -> None:
        """Put batches in flight while the pipeline takes them."""
        while self.queue and self.pipeline.can_launch(min(self.max_batch, self.queued_items)):
            self._launch()

    def accepted(self, plan: _Acks) -> None:
        for ack in plan.acks:
            self._write(self.engine.send(ack))
        self.silent = plan.silent_after
        self._launch_ready()

    def _launch(self) -> None:
        """Move the next batch, up to --batch-size events, from the queue to the device."""
        batch: list[Item] = []
        events = windows = 0
        queue = self.queue
        while queue:
            item = queue[0]
            kind = item.__class__
            if kind is WindowFrame:
                windows += 1
            else:
                room = self.max_batch - events
                if not room:
                    break
                if kind is JsonFrames and len(item) > room:  # type: ignore[arg-type]
                    batch_part, queue[0] = item.split(room)  # type: ignore[union-attr]
                    batch.append(batch_part)
                    events += room
                    break
                events += _weight(item)
            batch.append(queue.popleft())
        items = events + windows
        self.queued_items -= items
        plan = _Acks(self._plan(batch), batch[0].window, self.plan_silent)
        self.pipeline.launch(plan, batches=self._messages(batch), units=items, events=events, key=_first_key(batch))

    def _plan(self, batch: list[Item]) -> list[Ack]:
        """The acks for a batch: the last event of each window it touches (W 0 gets 0), none
        inside a 2^32-1 window."""
        acks: list[Ack] = []
        last: Ack | None = None  # the newest event so far, as its ack
        for item in batch:
            if item.__class__ is WindowFrame:
                if last is not None:
                    acks.append(last)
                    last = None
                self.plan_silent = item.size == SEQ_MAX  # type: ignore[union-attr]
                if item.size == 0:  # type: ignore[union-attr]
                    acks.append(Ack(0, item.window))
                continue
            if self.plan_silent:
                continue
            if last is not None and item.window != last.window:
                acks.append(last)
            last = Ack(item.seqs[-1] if item.__class__ is JsonFrames else item.seq, item.window)  # type: ignore[union-attr]
        if last is not None:
            acks.append(last)
        return acks

    def _messages(self, batch: list[Item]) -> Batches:
        mapper = self.host.mapper
        base = self.conn.metadata("2")
        received = base["received_at"]
        out = mapper.batches()
        for item in batch:
            kind = item.__class__
            if kind is WindowFrame:
                continue
            # A run of v2 J frames is mapped in one call, so its @metadata is encoded once
            # for the run; v1 string maps one by one, in order.
            common = dict(base)
            common["protocol_version"] = "1" if item.version == V1 else "2"  # type: ignore[union-attr]
            if kind is JsonFrames:
                mapper.add_payloads(out, item.texts(), common, Positions("seq", item.seqs),  # type: ignore[union-attr]
                                    created_ms=received)
            else:
                common["seq"] = item.seq  # type: ignore[union-attr]
                mapper.add(out, data_body(item), common, created_ms=received)  # type: ignore[arg-type]
        return out

    def _write(self, ack: bytes) -> None:
        """Each ack is one write: pylogbeat reads it as recv(1), recv(1), recv(4)."""
        self.conn.write(ack)
        self.keepalive.answered()

    def _still_working(self) -> bytes | None:
        """The last ack of the oldest window still waiting (or 0), repeated so the client waits."""
        if self.silent:
            return None
        oldest = self.pipeline.oldest()
        if oldest is not None:
            window = oldest.first_window
        elif self.queue:
            window = self.queue[0].window
        elif self.engine.mid_frame:
            window = self.engine.window
        else:
            return None
        return self.engine.send(Keepalive(window))


def _first_key(batch: list[Item]) -> bytes | None:
    """The client's own key of the batch's first event, which a resend after a restart starts
    with (acks end at batch boundaries): it homes the resend's connection (bridges/host/homes.py)."""
    for item in batch:
        if item.__class__ is JsonFrames:
            return client_key(item.texts()[0])  # type: ignore[union-attr]
        if item.__class__ is not WindowFrame:
            return None  # v1 key/value data: no client key
    return None


@dataclass(frozen=True, slots=True)
class LumberjackConfig:
    """The flags `Bridge.add_arguments` adds (their help text is there)."""

    max_decompressed_size: int
    max_pending_events: int
    max_process_pending_events: int

    @classmethod
    def from_flags(cls, args: argparse.Namespace, host: HostConfig) -> "LumberjackConfig":
        try:  # the engine's own check of its limits, at start rather than on every connection
            LumberjackServer(host.max_frame_size, args.max_decompressed_size)
        except LocalProtocolError as e:
            raise ValueError(str(e)) from None
        return from_flags(cls, args)


class Bridge(BridgeProtocol):
    """Lumberjack v1 (logstash-forwarder) and v2 (Beats) clients into a Logjam device."""

    name: ClassVar[str] = "lumberjack"
    default_port: ClassVar[int] = defaults.BRIDGE_PORTS["lumberjack"]
    default_max_frame: ClassVar[int] = DEFAULT_MAX_FRAME
    # Logstash's beats input closes clients after 60 s without data.
    default_idle_timeout: ClassVar[float] = 60.0
    Config = LumberjackConfig
    # The keepalive resends the last ack.
    knobs = Knobs(pipeline_depth=2, batch_size=2048, keepalive_interval=2.0,
                  renamed=(("pipeline", "pipeline_depth"), ("max_batch", "batch_size")))

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--max-decompressed-size", type=int, default=DEFAULT_MAX_DECOMPRESSED, metavar="BYTES",
                            help="bound on what one C frame may inflate to (default %(default)s)")
        parser.add_argument("--max-pending-events", type=int, default=4096, metavar="N",
                            help="per connection: stop reading once this many events await an ack (default %(default)s)")
        parser.add_argument("--max-process-pending-events", type=int, default=65536, metavar="N",
                            help="all connections together: stop reading clients once this many events "
                                 "await an ack (default %(default)s)")

    def __init__(self, config: LumberjackConfig, host: Host) -> None:
        super().__init__(config, host)
        # Events decoded and not yet acked, all connections together.
        self.budget = Budget(config.max_process_pending_events)

    async def serve(self, conn: Connection) -> None:
        await Session(self, conn).run()
