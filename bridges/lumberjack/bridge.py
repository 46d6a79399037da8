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
import itertools
import logging
import time
from collections import deque
from typing import Any, ClassVar

from bridges.host import BridgeProtocol, Connection, DeviceRejected, Host, IdleTimeout, body_from_bytes
from bridges.lumberjack.engine import (
    DEFAULT_MAX_DECOMPRESSED,
    DEFAULT_MAX_FRAME,
    V1,
    Ack,
    DataFrame,
    JsonFrame,
    Keepalive,
    SEQ_MAX,
    LumberjackServer,
    WindowFrame,
)
from logjam.errors import ProtocolError
from logjam.message import Message
from logjam.meta import now_ms

log = logging.getLogger(__name__)

FEED_SLICE = 8192

Item = DataFrame | JsonFrame | WindowFrame  # windows are queued to act on them in order


def event_body(event: DataFrame | JsonFrame) -> dict[str, Any]:
    """The Logjam body of one Lumberjack event (the Logstash convention)."""
    if isinstance(event, JsonFrame):
        return body_from_bytes(event.payload)
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


def _unread(conn: Connection) -> bytes:
    """Bytes the stream had received when the peer reset the connection.

    asyncio's StreamReader.read() raises the reset even when data is still buffered;
    this takes that data. (A workaround until Connection.read returns it first.)
    """
    buffer = getattr(getattr(conn, "_reader", None), "_buffer", None)
    if not buffer:
        return b""
    data = bytes(buffer)
    buffer.clear()
    return data


class Session:
    """One client connection."""

    def __init__(self, bridge: "Bridge", conn: Connection) -> None:
        args = bridge.args
        self.host: Host = bridge.host
        self.conn = conn
        self.engine = LumberjackServer(args.max_frame_size, args.max_decompressed_size)
        self.max_pending: int = args.max_pending_events
        self.max_batch: int = max(1, min(args.max_batch, self.max_pending))
        self.keepalive_interval: float = args.keepalive_interval
        self.pipeline: int = max(1, args.pipeline)
        # Decoded and not yet acked, in arrival order; the publisher pops after acking.
        self.unacked: deque[Item] = deque()
        self.queued = asyncio.Event()  # the reader added items, or finished
        self.room = asyncio.Event()  # the publisher acked items
        self.reader_done = False
        self.error: BaseException | None = None
        self.last_write = time.monotonic()
        # Inside a window of 2^32-1 the client has said it never waits for acks (stashward).
        # Like Logstash, which acks a full window, we send none there: such a client never
        # reads, and closing a socket with unread data turns its FIN into a reset that
        # discards whatever it had not yet transmitted.
        self.silent = False

    # -- tasks

    async def run(self) -> None:
        reader = asyncio.create_task(self._read(), name=f"lumberjack read {self.conn.peer}")
        keepalive = asyncio.create_task(self._keepalive(), name=f"lumberjack keepalive {self.conn.peer}")
        try:
            await self._publish()
        finally:
            keepalive.cancel()
            reader.cancel()
            await asyncio.gather(keepalive, reader, return_exceptions=True)
        if self.error is not None:
            raise self.error

    async def _read(self) -> None:
        # Bytes are read in up to 64 KiB but fed in small slices, checking the bound before
        # each: well-compressed input holds thousands of events per read, and decoded events
        # cost far more memory than the compressed bytes waiting here.
        pending = memoryview(b"")
        reset: ConnectionResetError | None = None
        try:
            while not self.conn.stopping:
                while len(self.unacked) >= self.max_pending:
                    self.room.clear()
                    await self.room.wait()
                if not pending:
                    if reset is not None:
                        raise reset
                    try:
                        data = await self.conn.read()
                    except IdleTimeout:
                        if self.unacked:  # the client is waiting for us, not idle
                            continue
                        raise
                    except ConnectionResetError as e:
                        # Clients that never read acks (stashward) reset the connection when
                        # they close; what they sent before that is still theirs to deliver.
                        data = _unread(self.conn)
                        if not data:
                            raise
                        reset = e
                    if not data:
                        break
                    pending = memoryview(data)
                chunk, pending = pending[:FEED_SLICE], pending[FEED_SLICE:]
                events = self.engine.feed(chunk)
                if events:
                    self._enqueue(events)
        except (ProtocolError, IdleTimeout, ConnectionError, OSError) as e:
            self.error = e
        finally:
            self.reader_done = True
            self.queued.set()

    def _enqueue(self, events: list[Any]) -> None:
        n = 0
        for event in events:
            self.unacked.append(event)
            if not isinstance(event, WindowFrame):
                n += 1
        if n:
            self.host.metrics.events_received.inc(n)
        self.queued.set()

    async def _publish(self) -> None:
        """Keep up to `pipeline` batches at the device; ack them strictly in order."""
        inflight: deque[tuple[list[Item], asyncio.Task[None]]] = deque()
        taken = 0  # items of self.unacked already in a batch
        try:
            while True:
                while len(inflight) < self.pipeline and taken < len(self.unacked):
                    batch = self._take_batch(taken)
                    taken += len(batch)
                    task = asyncio.ensure_future(self.host.link.publish(self._messages(batch)))
                    inflight.append((batch, task))
                if not inflight:
                    if self.reader_done and not self.unacked:
                        return
                    self.queued.clear()
                    await self.queued.wait()
                    continue
                batch, task = inflight[0]
                # Wake for the device's answer or for more input to put in flight meanwhile.
                self.queued.clear()
                waiter = asyncio.ensure_future(self.queued.wait())
                await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if not task.done():
                    continue
                inflight.popleft()
                try:
                    task.result()
                except DeviceRejected as e:
                    # Lumberjack has no error reply: ack nothing more and close, so the client
                    # keeps the events and sends them again once the cause is fixed.
                    self.host.metrics.device_rejected.inc(e.rejected)
                    log.error("lumberjack %s: %s; closing without ack (check --app-env/--topic)", self.conn.peer, e)
                    self.error = e
                    return
                self._ack(batch)
                for _ in range(len(batch)):
                    self.unacked.popleft()
                taken -= len(batch)
                self.room.set()
        finally:
            for _, task in inflight:
                task.cancel()
            if inflight:
                await asyncio.gather(*(t for _, t in inflight), return_exceptions=True)

    def _take_batch(self, start: int) -> list[Item]:
        batch: list[Item] = []
        data = 0
        for item in itertools.islice(self.unacked, start, None):
            if not isinstance(item, WindowFrame):
                if data == self.max_batch:
                    break
                data += 1
            batch.append(item)
        return batch

    def _messages(self, batch: list[Item]) -> list[Message]:
        mapper = self.host.mapper
        base = self.conn.metadata("1" if self.engine.version == V1 else "2")
        received = base["received_at"]
        out = []
        for item in batch:
            if isinstance(item, WindowFrame):
                continue
            meta = dict(base)
            meta["protocol_version"] = "1" if item.version == V1 else "2"
            meta["seq"] = item.seq
            out.append(mapper.message(event_body(item), meta, created_ms=received))
        return out

    def _ack(self, batch: list[Item]) -> None:
        """One ack per window the batch touched: its last event (W 0 gets 0), each in one write."""
        engine = self.engine
        last: DataFrame | JsonFrame | None = None
        acked = 0
        for item in batch:
            if isinstance(item, WindowFrame):
                if last is not None:
                    self._write(engine.send(Ack(last.seq, last.window)))
                    last = None
                self.silent = item.size == SEQ_MAX
                if item.size == 0:
                    self._write(engine.send(Ack(0, item.window)))
                continue
            acked += 1
            if self.silent:
                continue
            if last is not None and item.window != last.window:
                self._write(engine.send(Ack(last.seq, last.window)))
            last = item
        if last is not None:
            self._write(engine.send(Ack(last.seq, last.window)))
        if acked:
            self.host.metrics.events_acked.inc(acked)

    def _write(self, ack: bytes) -> None:
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
            if self.unacked:
                window = self.unacked[0].window
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
        parser.add_argument("--max-batch", type=int, default=2048, metavar="N",
                            help="events per pipelined publish to the device (default %(default)s)")
        parser.add_argument("--pipeline", type=int, default=2, metavar="N",
                            help="per connection: batches awaiting the device at once (default %(default)s)")

    async def serve(self, conn: Connection) -> None:
        await Session(self, conn).run()
