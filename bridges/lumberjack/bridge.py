"""`logjam-bridge lumberjack`: the asyncio glue between one Lumberjack client and the device.

Each connection runs three tasks around one `LumberjackServer` engine:
- the reader decodes frames into a bounded queue and stops reading while the queue is
  full (the device is slow, paused or down), so memory stays flat;
- the publisher sends whatever is queued to the device as one pipelined batch and,
  once the device has accepted all of it, acks the last event of each window it covered;
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
import time
from collections import deque
from typing import Any, ClassVar

from bridges.host import Batches, BridgeProtocol, Connection, DeviceRejected, Host, IdleTimeout, Positions
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
from logjam.errors import LocalProtocolError, ProtocolError

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


class Budget:
    """Items decoded and not yet acked, summed over every connection: the per-process bound.

    Readers wait while it is spent; any connection's ack refunds it and wakes them all to
    re-check (their own per-connection bound included).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._refunded = asyncio.Event()

    @property
    def spent(self) -> bool:
        return self.used >= self.limit

    def take(self, n: int) -> None:
        self.used += n

    def refund(self, n: int) -> None:
        self.used -= n
        self._refunded.set()

    async def wait_refund(self) -> None:
        self._refunded.clear()
        await self._refunded.wait()


class _Flight:
    """A batch at the device: the acks to write once it is accepted, and what it covers."""

    __slots__ = ("task", "acks", "items", "events", "first_window", "silent_after")

    def __init__(self, task: asyncio.Future[None], acks: list[Ack], items: int, events: int,
                 first_window: int, silent_after: bool) -> None:
        self.task = task
        self.acks = acks
        self.items = items
        self.events = events
        self.first_window = first_window
        self.silent_after = silent_after


class Session:
    """One client connection."""

    def __init__(self, bridge: "Bridge", conn: Connection) -> None:
        args = bridge.args
        self.host: Host = bridge.host
        self.budget: Budget = bridge.budget
        self.conn = conn
        self.engine = LumberjackServer(args.max_frame_size, args.max_decompressed_size)
        conn.partial = lambda: self.engine.buffered > 0
        self.max_pending: int = args.max_pending_events
        self.max_batch: int = max(1, min(args.max_batch, self.max_pending))
        self.keepalive_interval: float = args.keepalive_interval
        self.pipeline: int = max(1, args.pipeline)
        self.max_inflight: int | None = getattr(args, "max_inflight", None)
        # Decoded, not yet in a batch, in arrival order; `queued_items` is their weight.
        self.queue: deque[Item] = deque()
        self.queued_items = 0
        # Batches at the device, oldest first. Their decoded events are dropped once mapped:
        # only the acks they will need are kept.
        self.inflight: deque[_Flight] = deque()
        self.in_flight_items = 0
        self.queued = asyncio.Event()  # the reader added items, or finished
        self.reader_done = False
        self.error: BaseException | None = None
        self.last_write = time.monotonic()
        # Inflated bytes charged to the process budget: (items decoded when charged, bytes),
        # refunded once acks have covered those items.
        self.inflate = bridge.host.inflate
        self.inflate_marks: deque[tuple[int, int]] = deque()
        self.inflate_held = 0
        self.inflated_seen = 0
        self.items_taken = 0
        self.items_acked = 0
        # Inside a window of 2^32-1 the client has said it never waits for acks (stashward).
        # Like Logstash, which acks a full window, we send none there: such a client never
        # reads, and closing a socket with unread data turns its FIN into a reset that
        # discards whatever it had not yet transmitted.
        self.plan_silent = False  # as of the newest batch planned
        self.silent = False  # as of the newest batch acked

    @property
    def pending(self) -> int:
        """Events (and windows) decoded and not yet acked."""
        return self.queued_items + self.in_flight_items

    # -- tasks

    async def run(self) -> None:
        reader = asyncio.create_task(self._read(), name=f"lumberjack read {self.conn.peer}")
        keepalive = asyncio.create_task(self._keepalive(), name=f"lumberjack keepalive {self.conn.peer}")
        try:
            await self._publish()
        finally:
            self.budget.refund(self.pending)
            self.inflate.give(self.inflate_held)
            self.inflate_held = 0
            keepalive.cancel()
            reader.cancel()
            for flight in self.inflight:
                flight.task.cancel()
            await asyncio.gather(keepalive, reader, *(f.task for f in self.inflight), return_exceptions=True)
        # A device rejection was logged and counted where it happened; the rest is the host's.
        if self.error is not None and not isinstance(self.error, DeviceRejected):
            raise self.error

    async def _read(self) -> None:
        # Bytes are read in up to 64 KiB but fed in small slices, checking the bound before
        # each: well-compressed input holds thousands of events per read, and decoded events
        # cost far more memory than the compressed bytes waiting here.
        pending = memoryview(b"")
        try:
            while not self.conn.stopping:
                while self.pending >= self.max_pending or self.budget.spent:
                    await self.budget.wait_refund()
                if self.inflate.spent:
                    await self.inflate.wait()
                if not pending:
                    try:
                        data = await self.conn.read()
                    except IdleTimeout:
                        if self.pending:  # the client is waiting for us, not idle
                            continue
                        raise
                    if not data:
                        break
                    pending = memoryview(data)
                chunk, pending = pending[:FEED_SLICE], pending[FEED_SLICE:]
                events = self.engine.feed(chunk)
                if events:
                    self._enqueue(events)
                if self.engine.inflated_total != self.inflated_seen:
                    self._charge_inflated()
        except (ProtocolError, IdleTimeout, ConnectionError, OSError) as e:
            self.error = e
        finally:
            self.reader_done = True
            self.queued.set()

    def _enqueue(self, events: list[Item]) -> None:
        self.queue.extend(events)
        weight = sum(map(_weight, events))
        windows = sum(1 for e in events if e.__class__ is WindowFrame)
        self.queued_items += weight
        self.items_taken += weight
        self.budget.take(weight)
        if weight > windows:
            self.host.metrics.events_received.inc(weight - windows)
        self.queued.set()

    def _charge_inflated(self) -> None:
        delta = self.engine.inflated_total - self.inflated_seen
        self.inflated_seen = self.engine.inflated_total
        self.inflate.take(delta)
        self.inflate_held += delta
        self.inflate_marks.append((self.items_taken, delta))
        self._refund_inflated()

    def _refund_inflated(self) -> None:
        marks = self.inflate_marks
        while marks and marks[0][0] <= self.items_acked:
            _, n = marks.popleft()
            self.inflate_held -= n
            self.inflate.give(n)

    def _link_has_room(self) -> bool:
        """Pipeline another batch only if the device link can take it now: a batch that would
        just wait for room holds its mapped messages in memory for nothing."""
        if self.max_inflight is None:
            return True
        # Our own batches may not be counted by the link yet; counting them twice errs on
        # the side of not pipelining when the device is already busy.
        ours = sum(f.events for f in self.inflight)
        batch = min(self.max_batch, self.queued_items)
        return self.host.link.inflight + ours + batch <= self.max_inflight

    async def _publish(self) -> None:
        """Keep up to `pipeline` batches at the device; ack them strictly in order."""
        inflight = self.inflight
        while True:
            while self.queue and len(inflight) < self.pipeline and (not inflight or self._link_has_room()):
                self._launch()
            if not inflight:
                if self.reader_done and not self.queue:
                    return
                self.queued.clear()
                await self.queued.wait()
                continue
            flight = inflight[0]
            if not flight.task.done():
                # Wake for the device's answer, or for new input to put in flight meanwhile.
                self.queued.clear()
                waiter = asyncio.ensure_future(self.queued.wait())
                await asyncio.wait((flight.task, waiter), return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if not flight.task.done():
                    continue
            inflight.popleft()
            try:
                flight.task.result()
            except DeviceRejected as e:
                # Lumberjack has no error reply: ack nothing more and close, so the client
                # keeps the events and sends them again once the cause is fixed.
                self.host.metrics.device_rejected.inc(e.rejected)
                log.error("lumberjack %s: %s; closing without ack (check --app-env/--topic)", self.conn.peer, e)
                self.error = e
                return
            for ack in flight.acks:
                self._write(self.engine.send(ack))
            self.silent = flight.silent_after
            if flight.events:
                self.host.metrics.events_acked.inc(flight.events)
            self.in_flight_items -= flight.items
            self.budget.refund(flight.items)
            self.items_acked += flight.items
            if self.inflate_marks:
                self._refund_inflated()

    def _launch(self) -> None:
        """Move the next batch, up to --max-batch events, from the queue to the device."""
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
        acks = self._plan(batch)
        task = asyncio.ensure_future(self.host.link.publish(self._messages(batch).batches))
        self.inflight.append(_Flight(task, acks, items, events, batch[0].window, self.plan_silent))
        self.in_flight_items += items

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
        self.last_write = time.monotonic()

    async def _keepalive(self) -> None:
        interval = self.keepalive_interval
        while True:
            await asyncio.sleep(max(0.05, interval - (time.monotonic() - self.last_write)))
            if time.monotonic() - self.last_write < interval:
                continue
            if self.silent:
                self.last_write = time.monotonic()
                continue
            if self.inflight:
                window = self.inflight[0].first_window
            elif self.queue:
                window = self.queue[0].window
            elif self.engine.buffered:
                window = self.engine.window
            else:
                self.last_write = time.monotonic()  # nothing pending: restart the clock
                continue
            self._write(self.engine.send(Keepalive(window)))


class Bridge(BridgeProtocol):
    """Lumberjack v1 (logstash-forwarder) and v2 (Beats) clients into a Logjam device."""

    name: ClassVar[str] = "lumberjack"
    default_port: ClassVar[int] = 5044
    default_max_frame: ClassVar[int] = DEFAULT_MAX_FRAME
    # Logstash's beats input closes clients after 60 s without data.
    default_idle_timeout: ClassVar[float] = 60.0

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--max-decompressed-size", type=int, default=DEFAULT_MAX_DECOMPRESSED, metavar="BYTES",
                            help="bound on what one C frame may inflate to (default %(default)s)")
        parser.add_argument("--keepalive-interval", type=float, default=2.0, metavar="SECONDS",
                            help="resend the last ack this often while events wait for the device (default %(default)s)")
        parser.add_argument("--max-pending-events", type=int, default=4096, metavar="N",
                            help="per connection: stop reading once this many events await an ack (default %(default)s)")
        parser.add_argument("--max-process-pending-events", type=int, default=65536, metavar="N",
                            help="all connections together: stop reading clients once this many events "
                                 "await an ack (default %(default)s)")
        parser.add_argument("--max-batch", type=int, default=2048, metavar="N",
                            help="events per pipelined publish to the device (default %(default)s)")
        parser.add_argument("--pipeline", type=int, default=2, metavar="N",
                            help="per connection: batches awaiting the device at once (default %(default)s)")

    def __init__(self, args: argparse.Namespace, host: Host) -> None:
        super().__init__(args, host)
        try:  # refuse bad limits at start, not on every connection
            LumberjackServer(args.max_frame_size, args.max_decompressed_size)
        except LocalProtocolError as e:
            raise SystemExit(f"logjam-bridge lumberjack: {e}") from None
        self.budget = Budget(args.max_process_pending_events)

    async def serve(self, conn: Connection) -> None:
        await Session(self, conn).run()
