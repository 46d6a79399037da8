"""The segment bridge's session glue: Pravega wire protocol in, durable segments, Logjam out.

`logjam-bridge segment` serves Pravega's segment-store protocol (see engine.py). Each
append is written to the segment store under --data-dir, every event in it becomes
one Logjam message, and DataAppended goes back only after the append is durable and
the device accepted every one of its events. Acks leave in the order appends came in.

Exactly-once resume, and what survives a kill (docs/protocols/segment.md has more):

1. An append is stored first (data + index record), then published to the device.
2. When the device has accepted all of it, the segment's forwarded watermark moves
   past it (durably), and only then is DataAppended sent.
3. At start, every segment's appends between the watermark and its end (stored, but
   maybe never accepted by the device because the bridge died) are forwarded again.
   SetupAppend waits until the segment's watermark reaches its end before answering,
   so the lastEventNumber in AppendSetup (which tells a reconnecting writer to skip
   everything up to it) never covers an event the device has not accepted.

A store write that fails (a full disk) is held, not answered: the session stops
reading, sends KeepAlives, and tries the same append (or fsync) again about once a
second until it works (Pravega's protocol has no "try later" reply, and a real segment
store is slow, not failing, when its storage is). `StoreHealth` logs it once.

A kill between the device's 202 and the watermark write makes step 3 forward that
append a second time: at the device, delivery across a crash is at-least-once in
that window, and both copies carry the same `@metadata._id`
(`segment:<store id>:<segment>@<segment_offset>`), by which an importer that sees both
drops the second (docs/reliability.md). In the segment itself there are never duplicates:
writer state is stored with the data and a writer resending old event numbers is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

from bridges.host import Batches, BridgeProtocol, Connection, DeviceRejected, Host, KeepaliveTimer, Positions, forward
from bridges.host.session import PipelineSession
from bridges.host.config import HostConfig, Knobs
from bridges.host.files import RETRY_EVERY, StoreHealth
from bridges.segment import engine as wire
from bridges.segment.store import AppendRecord, Segment, SegmentExists, SegmentStore, StoreError
from runtime.config import FSYNC_POLICIES, from_flags
from logjam import defaults
from logjam.meta import now_ms

log = logging.getLogger("logjam-bridge.segment")

ILLEGAL_ARGUMENT = 0  # ErrorMessage.ErrorCode.ILLEGAL_ARGUMENT_EXCEPTION
UNSPECIFIED = -1


@dataclass(frozen=True, slots=True)
class SegmentConfig:
    """The flags `Bridge.add_arguments` adds (their help text is there)."""

    data_dir: str
    fsync: str
    fsync_interval: float
    max_read_size: int
    max_pending_bytes: int

    @classmethod
    def from_flags(cls, args: argparse.Namespace, host: HostConfig) -> "SegmentConfig":
        return from_flags(cls, args)


class Bridge(BridgeProtocol):
    name = "segment"
    default_port = defaults.BRIDGE_PORTS["segment"]
    default_max_frame = wire.MAX_COMMAND_SIZE
    default_idle_timeout = 120.0
    Config = SegmentConfig
    # A batch is one append; the keepalive is a KeepAlive to a client whose acks wait.
    knobs = Knobs(pipeline_depth=32, keepalive_interval=10.0, renamed=(("max_pending_appends", "pipeline_depth"),))

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--data-dir", default=str(defaults.data_root() / "segment"),
                            help="where segments are stored (default $LOGJAM_DATA_DIR/segment, else ./data/segment)")
        parser.add_argument(
            "--fsync", default="always", choices=FSYNC_POLICIES,
            help="always: fsync before every ack (group commit); interval: every --fsync-interval s; never: leave it to the OS",
        )
        parser.add_argument("--fsync-interval", type=float, default=1.0, metavar="SECONDS")
        parser.add_argument("--max-read-size", type=int, default=2 * 1024 * 1024, metavar="BYTES",
                            help="largest SegmentRead reply (default %(default)s)")
        parser.add_argument("--max-pending-bytes", type=int, default=64 * 1024 * 1024, metavar="BYTES",
                            help="append bytes awaiting the device per connection before reading stops (default %(default)s)")

    def __init__(self, config: SegmentConfig, host: Host) -> None:
        super().__init__(config, host)
        self.store = SegmentStore(config.data_dir, config.fsync)
        self.health = StoreHealth(log, host.metrics, "segment store")
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.store.open()
        for seg in self.store:
            pending = seg.unforwarded()
            if pending:
                log.warning("segment %s: %d stored appends not yet accepted by the device; forwarding them", seg.name, len(pending))
                self._tasks.append(asyncio.create_task(self._recover(seg, pending), name=f"recover {seg.name}"))
        if self.config.fsync == "interval":
            self._tasks.append(asyncio.create_task(self._flusher(), name="fsync"))
        log.info("segment store at %s: %d segments, fsync %s", self.store.root, len(self.store.segments), self.config.fsync)

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(self.config.fsync_interval)
            try:
                await self.store.flush()
            except OSError as e:
                self.health.failed(e, "the next interval tries again")

    async def sync(self, seg: Segment, end: int) -> None:
        """Make `seg` durable up to `end` per the policy; a failed fsync is tried again until it works."""
        held = False
        while True:
            try:
                await seg.sync(end)
            except OSError as e:
                self.health.failed(e, "holding acknowledgements until it can write")
                held = True
                await asyncio.sleep(RETRY_EVERY)
                continue
            if held:  # only a write that failed before says the disk is back
                self.health.succeeded()
            return

    async def _recover(self, seg: Segment, records: Sequence[AppendRecord]) -> None:
        base = {"protocol": self.name, "protocol_version": str(wire.WIRE_VERSION), "received_at": now_ms(), "recovered": True}
        for rec in records:
            data = await asyncio.to_thread(_pread, seg, rec)
            events, _ = wire.split_events(data)
            first = rec.last_event_number - rec.num_events + 1
            msgs = self.host.mapper.batches()
            self.add(msgs, [p for _, p in events], base, seg.name, rec.writer_id, first, [rec.start + off for off, _ in events])
            if not await forward(self.host, msgs, f"segment {seg.name}: recovered events at offset {rec.start}"):
                self.host.metrics.events_acked.inc(len(msgs))
            seg.mark_forwarded(rec)
        log.info("segment %s: recovery forwarding done", seg.name)

    def add(
        self, out: Batches, payloads: Sequence[bytes], base: dict[str, Any], segment: str, writer: uuid.UUID,
        first_number: int, offsets: list[int],
    ) -> None:
        """Map one append's events (numbered from `first_number`, at `offsets` in the segment)."""
        common = {**base, "segment": segment, "writer_id": str(writer)}
        # The event's place in the store is its key: the same when recovery forwards it again.
        numbers = range(first_number, first_number + len(payloads))
        key = f"segment:{self.store.id}:{segment}@"
        positions = Positions("event_number", numbers, "segment_offset", offsets, key, offsets)
        self.host.mapper.add_payloads(out, payloads, common, positions)

    @classmethod
    def data_dir(cls, config: SegmentConfig) -> str:
        return config.data_dir

    async def serve(self, conn: Connection) -> None:
        await Session(self, conn).run()

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.config.fsync != "never":
            try:
                await self.store.flush()
            except OSError as e:
                log.error("fsync at shutdown failed: %s", e)
        self.store.close()


def _pread(seg: Segment, rec: AppendRecord) -> bytes:
    data, _, _ = seg.read(rec.start, rec.end - rec.start)
    return data


class _Answer:
    """The replies one request earns, in its place in line: an append's DataAppended once it
    is durable and the device accepted it (`append` says which), or a refusal at once."""

    __slots__ = ("replies", "close", "append")

    def __init__(self, replies: list[wire.Reply], close: bool = False, append: wire.Append | None = None) -> None:
        self.replies = replies
        self.close = close
        self.append = append


class Session(PipelineSession[_Answer]):
    """One client connection: requests in order, acks in order, keepalives while waiting."""

    def __init__(self, bridge: Bridge, conn: Connection) -> None:
        host = bridge.host
        # Replies leave in request order. The pipeline's units are append bytes not yet
        # accepted by the device: they bound this connection's memory.
        super().__init__(
            host, conn, wire.SegmentServer(min(host.config.max_frame_size, wire.MAX_COMMAND_SIZE)),
            name="segment", depth=host.config.pipeline_depth, max_pending=bridge.config.max_pending_bytes,
            # Stored but refused by the device: say so, and let the writer reconnect.
            consequence="answering ErrorMessage and closing",
        )
        self.bridge = bridge
        self.store = bridge.store
        self.keepalive = KeepaliveTimer(conn, bridge.host.config.keepalive_interval, self._still_working)
        self.acked: dict[uuid.UUID, int] = {}
        self.version = str(wire.WIRE_VERSION)
        self.ending = False  # read no more requests
        self.closed = False  # write no more replies
        self.waiting = 0  # requests held for the disk or for SetupAppend's watermark

    def write(self, replies: Sequence[wire.Reply]) -> None:
        if not self.closed and replies:
            self.conn.write(b"".join(self.engine.send(r) for r in replies))

    async def in_line(self, replies: Sequence[wire.Reply], close: bool = False) -> None:
        """Answer after everything before it was answered."""
        await self.pipeline.slot()
        self.pipeline.launch(_Answer(list(replies), close))

    async def run(self) -> None:
        keepalive = self.keepalive.start(f"segment keepalive {self.conn.peer}")
        error: BaseException | None = None
        try:
            try:
                await self.read_loop()
            except wire.EventNumberWentBackwards as e:
                await self.in_line([wire.InvalidEventNumber(e.writer_id, e.request_id, "", e.event_number)], True)
                error = e
            except Exception as e:
                # ProtocolError, IdleTimeout, a lost connection: acks still go out below,
                # then the host logs and counts the error.
                error = e
            # Whatever was forwarded still gets its ack before the connection ends; after a
            # failure the rest still finishes, so the store marks what the device took.
            await self.pipeline.finish(through_failure=True)
        finally:
            # At shutdown, once the grace is over, what is cancelled here is stored and is
            # forwarded again at the next start.
            keepalive.cancel()
            await self.pipeline.close()
        if error is not None:
            raise error

    def done(self) -> bool:
        return self.ending

    async def on_events(self, events: list[wire.Request]) -> None:
        for request in events:
            await self._dispatch(request)
            if self.ending:
                break

    async def after_read(self) -> None:
        if not self.closed:
            await self.conn.drain()  # a client that does not read its replies is not read either

    def accepted(self, answer: _Answer) -> None:
        self.write(answer.replies)
        if answer.close and not self.closed:
            self._close()

    def refused(self, answer: _Answer, error: BaseException) -> None:
        if isinstance(error, DeviceRejected) and answer.append is not None:
            a = answer.append
            self.write([wire.ErrorMessage(a.request_id, a.segment, str(error), UNSPECIFIED)])
        else:
            # E.g. an fsync failed: nothing more is acknowledged on this connection.
            log.error("%s: append failed; closing the connection", self.conn.peer, exc_info=error)
        self._close()

    def _close(self) -> None:
        self.closed = self.ending = True
        self.conn.stop_reading()

    def _still_working(self) -> bytes | None:
        # While acks wait on a slow or absent device the client must not time out.
        if self.closed or not (self.waiting or len(self.pipeline)):
            return None
        return self.engine.send(wire.KeepAlive())

    async def _dispatch(self, req: wire.Request) -> None:
        if isinstance(req, wire.Append):
            await self._append(req)
        elif isinstance(req, wire.Hello):
            self.version = str(req.high_version)
            self.write([wire.Hello()])
            if not req.compatible():
                log.warning("%s: incompatible wire versions %d..%d; closing", self.conn.peer, req.low_version, req.high_version)
                await self.in_line([], True)
                self.ending = True
        elif isinstance(req, wire.KeepAlive):
            self.write([req])
        elif isinstance(req, wire.SetupAppend):
            await self._setup_append(req)
        elif isinstance(req, wire.ReadSegment):
            self.write([self._read(req)])
        elif isinstance(req, wire.GetStreamSegmentInfo):
            seg = self.store.get(req.segment)
            if seg is None:
                self.write([wire.NoSuchSegment(req.request_id, req.segment, "", -1)])
            else:
                self.write([wire.StreamSegmentInfo(
                    req.request_id, req.segment, True, seg.sealed, False, seg.last_modified, seg.durable, 0
                )])
        elif isinstance(req, wire.CreateSegment):
            self.write([self._create(req)])
        elif isinstance(req, wire.SealSegment):
            seg = self.store.get(req.segment)
            if seg is None:
                self.write([wire.NoSuchSegment(req.request_id, req.segment, "", -1)])
            else:
                try:
                    seg.seal()
                except OSError as e:
                    self.bridge.health.failed(e, "answering SealSegment with an error")
                    self.write([wire.ErrorMessage(req.request_id, req.segment, f"cannot seal: {e}", UNSPECIFIED)])
                    return
                self.write([wire.SegmentSealed(req.request_id, req.segment)])
        elif isinstance(req, wire.Unsupported):
            self.write([wire.OperationUnsupported(req.request_id, req.name, "")])

    def _create(self, req: wire.CreateSegment) -> wire.Reply:
        if not req.segment:
            return wire.ErrorMessage(req.request_id, req.segment, "segment name is empty", ILLEGAL_ARGUMENT)
        try:
            self.store.create(req.segment)
        except SegmentExists:
            return wire.SegmentAlreadyExists(req.request_id, req.segment, "")
        except StoreError as e:
            self.bridge.health.failed(e, "answering CreateSegment with an error")
            return wire.ErrorMessage(req.request_id, req.segment, str(e), UNSPECIFIED)
        return wire.SegmentCreated(req.request_id, req.segment)

    async def _setup_append(self, req: wire.SetupAppend) -> None:
        seg = self.store.get(req.segment)
        if seg is None:
            self.write([wire.NoSuchSegment(req.request_id, req.segment, "", -1)])
            return
        if seg.sealed:
            self.write([wire.SegmentIsSealed(req.request_id, req.segment, "", -1)])
            return
        # lastEventNumber is an implicit ack: it must not cover events the device lacks.
        if seg.forwarded < seg.length:
            self.waiting += 1
            try:
                await seg.wait_forwarded(seg.length)
            finally:
                self.waiting -= 1
        last = seg.last_event(req.writer_id)
        self.acked[req.writer_id] = last
        self.write([wire.AppendSetup(req.request_id, req.segment, req.writer_id, last)])

    def _read(self, req: wire.ReadSegment) -> wire.Reply:
        seg = self.store.get(req.segment)
        if seg is None:
            return wire.NoSuchSegment(req.request_id, req.segment, "", req.offset)
        if req.offset < 0 or req.offset > seg.durable:
            return wire.ErrorMessage(
                req.request_id, req.segment,
                f"offset {req.offset} is outside the segment (0..{seg.durable})", ILLEGAL_ARGUMENT,
            )
        # The reply must fit one command: leave room for its header and fields.
        room = self.engine.max_command - 64 - len(req.segment.encode("utf-8", "surrogatepass")) * 3
        size = max(wire.HEADER_SIZE, min(req.suggested_length, self.bridge.config.max_read_size, room))
        data, at_tail, end = seg.read(req.offset, size)
        return wire.SegmentRead(req.segment, req.offset, at_tail, end, data, req.request_id)

    async def _append(self, a: wire.Append) -> None:
        # Nothing more is read from this client while an append waits for the disk.
        held = False
        while (seg := await self._check_append(a)) is not None:
            stored = seg.last_event(a.writer_id)
            try:
                rec = seg.append(a.writer_id, a.data, a.num_events, a.last_event_number)
            except StoreError as e:
                self.bridge.health.failed(e, "holding appends until it can write")
                held = True
                self.waiting += 1  # KeepAlives go out meanwhile
                try:
                    await asyncio.sleep(RETRY_EVERY)
                finally:
                    self.waiting -= 1
                continue  # the segment may have changed meanwhile: check again
            if held:  # only an append that failed before says the disk is back
                self.bridge.health.succeeded()
            await self._forward(a, seg, rec, stored)
            return

    async def _check_append(self, a: wire.Append) -> Segment | None:
        """The segment `a` goes to; or None after queueing the refusal Pravega sends."""
        seg = self.store.get(a.segment)
        if seg is None:
            await self.in_line([wire.NoSuchSegment(a.request_id, a.segment, "", -1)])
            return None
        if seg.sealed:
            await self.in_line([wire.SegmentIsSealed(a.request_id, a.segment, "", a.last_event_number)])
            return None
        stored = seg.last_event(a.writer_id)
        if a.last_event_number <= stored:
            # Already in the segment (a resend past AppendSetup) or going backwards: Pravega refuses it.
            log.warning("%s: writer %s sent event number %d, already at %d", self.conn.peer, a.writer_id, a.last_event_number, stored)
            await self.in_line([wire.InvalidEventNumber(a.writer_id, a.request_id, "", a.last_event_number)], True)
            self.ending = True
            return None
        if a.expected_offset is not None and a.expected_offset != seg.length:
            await self.in_line([wire.ConditionalCheckFailed(a.writer_id, a.last_event_number, a.request_id)])
            return None
        return seg

    async def _forward(self, a: wire.Append, seg: Segment, rec: AppendRecord, stored: int) -> None:
        """Publish a stored append; its ack is in line and sent once the device accepted it."""
        self.host.metrics.events_received.inc(a.num_events)
        base = self.conn.metadata(self.version)
        first = a.first_event_number
        msgs = self.host.mapper.batches()
        self.bridge.add(msgs, a.payloads, base, a.segment, a.writer_id, first, [rec.start + off for off in a.event_offsets])
        previous = self.acked.get(a.writer_id, stored)
        self.acked[a.writer_id] = a.last_event_number
        answer = _Answer([wire.DataAppended(a.writer_id, a.last_event_number, previous, a.request_id, rec.end)], append=a)
        pipeline = self.pipeline
        self.take(len(a.data))
        await pipeline.slot()
        pipeline.launch(answer, work=self._publish(seg, rec, msgs), units=len(a.data), events=a.num_events)
        await pipeline.room()  # read no more while too much waits on the device

    async def _publish(self, seg: Segment, rec: AppendRecord, msgs: Batches) -> None:
        await self.bridge.sync(seg, rec.end)
        try:
            await self.host.link.publish(msgs.batches)
        except DeviceRejected:
            seg.mark_forwarded(rec)  # forwarding it again would be refused again
            raise
        seg.mark_forwarded(rec)
