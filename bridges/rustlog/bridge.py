"""`logjam-bridge rustlog`: a RustLog broker (both dialects) whose produced records also go to a device.

Each connection runs one sans-IO `RustlogServer`; requests are served strictly
in order, one at a time, and nothing more is read from the client while a request
waits for the disk or the device (that is the back-pressure). A Produce is
answered only after its records are in the durable log AND the device accepted
every one of them. What is stored but not yet accepted (a crash in between, a
device that was down) is forwarded again from the log at start-up, using the
per-partition forwarded watermark.

When the log cannot be written (a full disk), a Produce stores nothing and is answered
with the protocol's own error, 507 InsufficientSpace in JSON (a 5xx the spec tells
clients to retry with backoff; 503 for other I/O errors) and 500 in the binary dialect;
every Produce tries the disk again, so the bridge resumes by itself. An fsync that fails
after the records went to the device is tried again (the Produce waits) rather than
answered with an error, since the device already has them. `StoreHealth` logs it once
and shows it in both metrics (Prometheus and MetricsFetch).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

from bridges.host import Batches, BridgeProtocol, Connection, FrameTimeout, Host, Positions, forward
from bridges.host.admission import raise_open_file_limit
from bridges.host.config import HostConfig
from bridges.host.files import RETRY_EVERY, StoreHealth
from bridges.host.session import EngineSession
from bridges.rustlog import engine as e
from bridges.rustlog.log import (
    BadPartitionCount,
    Log,
    LogConfig,
    PartitionLog,
    PartitionNotFound,
    StorageError,
    StoredRecord,
    TopicExists,
    TopicNotFound,
    now_us,
)
from logjam import defaults
from logjam.errors import RemoteProtocolError
from runtime.config import FSYNC_POLICIES, from_flags
from logjam.validation import is_valid_app_env

log = logging.getLogger("logjam-bridge.rustlog")

FORWARD_CHUNK_BYTES = 1 << 20


def parse_app_env_map(items: Sequence[str] | str | None) -> dict[str, str]:
    """`TOPIC=APP-ENV` pairs (repeatable, or comma-separated) -> {topic: app-env}."""
    if not items:
        return {}
    if isinstance(items, str):
        items = [items]
    out: dict[str, str] = {}
    for item in items:
        for pair in str(item).split(","):
            pair = pair.strip()
            if not pair:
                continue
            topic, sep, app_env = pair.partition("=")
            if not sep or not topic or not is_valid_app_env(app_env):
                raise ValueError(f"--app-env-map {pair!r}: expected TOPIC=APP-ENV with a valid app-env such as shop-production")
            out[topic] = app_env
    return out


@dataclass
class _Latency:
    count: int = 0
    total: float = 0.0
    max: float = 0.0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.max = max(self.max, seconds)


class RustlogMetrics:
    """The counters MetricsFetch reports (JSON values or Prometheus text)."""

    def __init__(self) -> None:
        self.records_in = 0
        self.bytes_in = 0
        self.records_out = 0
        self.bytes_out = 0
        self.connections_total = 0
        self.connections_active = 0
        self.requests = 0
        self.errors = 0
        self.device_rejected = 0
        self.records_reforwarded = 0
        self.produce = _Latency()
        self.fetch = _Latency()

    def metrics(self, log_: Log, health: StoreHealth) -> list[e.Metric | e.Summary]:
        m = e.Metric
        return [
            m("store_writable", "gauge", "1 while log writes succeed, 0 while they fail (a full disk)", int(health.writable)),
            m("store_write_failures_total", "counter", "Log writes and fsyncs that failed", health.failures),
            m("records_in_total", "counter", "Records produced", self.records_in),
            m("bytes_in_total", "counter", "Record payload bytes produced", self.bytes_in),
            m("records_out_total", "counter", "Records fetched", self.records_out),
            m("bytes_out_total", "counter", "Record payload bytes fetched", self.bytes_out),
            m("connections_total", "counter", "Client connections accepted", self.connections_total),
            m("connections_active", "gauge", "Open client connections", self.connections_active),
            m("requests_total", "counter", "Requests served", self.requests),
            m("errors_total", "counter", "Error responses sent", self.errors),
            m("device_rejected_total", "counter", "Records the device answered 400", self.device_rejected),
            m("records_reforwarded_total", "counter", "Stored records forwarded again after a restart", self.records_reforwarded),
            e.Summary("produce_latency_seconds", "Produce latency", self.produce.count, self.produce.total),
            m("produce_latency_seconds_max", "gauge", "Slowest Produce", self.produce.max),
            e.Summary("fetch_latency_seconds", "Fetch latency", self.fetch.count, self.fetch.total),
            m("fetch_latency_seconds_max", "gauge", "Slowest Fetch", self.fetch.max),
            m("topics", "gauge", "Topics", len(log_.partitions)),
        ]

    def response(self, log_: Log, health: StoreHealth) -> e.MetricsResponse:
        metrics = self.metrics(log_, health)
        values: dict[str, Any] = e.metric_values(metrics)
        values["produce_latency_avg_seconds"] = self.produce.total / self.produce.count if self.produce.count else 0.0
        values["fetch_latency_avg_seconds"] = self.fetch.total / self.fetch.count if self.fetch.count else 0.0
        return e.MetricsResponse(values, e.render_prometheus(metrics))


@dataclass(frozen=True, slots=True)
class RustlogConfig:
    """The flags `Bridge.add_arguments` adds (their help text is there); `app_env_map` parsed."""

    data_dir: str
    fsync: str
    fsync_interval_ms: int
    segment_bytes: int
    index_interval_bytes: int
    retention_ms: int | None
    retention_bytes: int | None
    max_total_partitions: int
    retention_check_interval_ms: int
    app_env_map: dict[str, str]

    @classmethod
    def from_flags(cls, args: argparse.Namespace, host: HostConfig) -> "RustlogConfig":
        return from_flags(cls, args, app_env_map=parse_app_env_map(args.app_env_map))


class Bridge(BridgeProtocol):
    name = "rustlog"
    default_port = defaults.BRIDGE_PORTS["rustlog"]
    default_max_frame = e.MAX_FRAME_SIZE
    # Consumers often sit idle between polls; RustLog has no keepalive message.
    default_idle_timeout = 600.0
    Config = RustlogConfig

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("rustlog")
        g.add_argument("--data-dir", default=str(defaults.data_root() / "rustlog"),
                       help="where the partitioned log lives (default $LOGJAM_DATA_DIR/rustlog, else ./data/rustlog)")
        g.add_argument("--fsync", choices=FSYNC_POLICIES, default="always",
                       help="always: fsync before every acknowledgement; interval: every --fsync-interval-ms; never: leave it to the OS (default %(default)s)")
        g.add_argument("--fsync-interval-ms", type=int, default=1000, metavar="MS")
        g.add_argument("--segment-bytes", type=int, default=16 * 1024 * 1024, metavar="BYTES", help="roll segments at this size (default %(default)s)")
        g.add_argument("--index-interval-bytes", type=int, default=4096, metavar="BYTES", help="bytes between sparse index entries (default %(default)s)")
        g.add_argument("--retention-ms", type=int, metavar="MS", help="delete segments whose records are all older than this")
        g.add_argument("--retention-bytes", type=int, metavar="BYTES", help="keep at most about this many bytes per partition")
        g.add_argument("--max-total-partitions", type=int, default=10_000, metavar="N",
                       help="partitions of all topics together that CreateTopic may reach (default %(default)s)")
        g.add_argument("--retention-check-interval-ms", type=int, default=30_000, metavar="MS")
        g.add_argument("--app-env-map", action="append", metavar="TOPIC=APP-ENV",
                       help="publish records of a rustlog topic under this app-env; repeatable or comma-separated")

    @classmethod
    def data_dir(cls, config: RustlogConfig) -> str:
        return config.data_dir

    def __init__(self, config: RustlogConfig, host: Host) -> None:
        super().__init__(config, host)
        self.log_config = LogConfig(
            segment_bytes=config.segment_bytes,
            index_interval_bytes=config.index_interval_bytes,
            retention_ms=config.retention_ms,
            retention_bytes=config.retention_bytes,
            fsync=config.fsync,
            max_total_partitions=config.max_total_partitions,
        )
        raise_open_file_limit()  # every partition in use holds a segment and an index open
        self.log = Log(config.data_dir, self.log_config)
        self.stats = RustlogMetrics()
        self.health = StoreHealth(log, host.metrics, "rustlog log")
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._tasks: list[asyncio.Task[None]] = []
        log.info("data dir %s: %d topics, fsync %s", config.data_dir, len(self.log.partitions), config.fsync)

    # -- lifecycle

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._recover(), name="rustlog recovery"))
        if self.log_config.retention_ms is not None or self.log_config.retention_bytes is not None:
            self._tasks.append(asyncio.create_task(self._retention_loop(), name="rustlog retention"))
        if self.log_config.fsync == "interval":
            self._tasks.append(asyncio.create_task(self._fsync_loop(), name="rustlog fsync"))

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.log.close()

    def _lock(self, topic: str, partition: int) -> asyncio.Lock:
        key = (topic, partition)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    async def _recover(self) -> None:
        """Forward what was stored but never accepted by the device (a crash, or a device that was down)."""
        for topic, p, plog in list(self.log.all_partitions()):
            if plog.forwarded >= plog.high_watermark:
                continue
            try:
                async with self._lock(topic, p):
                    n = await self._forward_backlog(topic, p, plog, plog.high_watermark)
            except StorageError as err:
                # The next Produce on this partition tries again (it forwards the backlog first).
                log.error("could not re-forward %s/%d: %s", topic, p, err)
                continue
            log.info("forwarded %d stored records of %s/%d that the device had not accepted", n, topic, p)

    async def _retention_loop(self) -> None:
        interval = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                deleted = self.log.enforce_retention()
            except (OSError, StorageError) as err:
                log.error("retention failed: %s", err)
                continue
            if deleted:
                log.info("retention deleted %d segments", deleted)

    async def _fsync_loop(self) -> None:
        interval = self.config.fsync_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.log.sync()
            except (OSError, StorageError) as err:
                self.health.failed(err, "the next interval tries again")

    # -- mapping and forwarding

    def _messages(self, out: Batches, topic: str, partition: int, base: int, records: Sequence[bytes],
                  timestamp_us: int, metadata: dict[str, Any]) -> Batches:
        offsets = range(base, base + len(records))
        # The record's place in the log is its key: the same when the backlog is forwarded again.
        self.host.mapper.add_payloads(
            out, records, {**metadata, "topic": topic, "partition": partition},
            Positions("offset", offsets, key_prefix=f"rustlog:{self.log.id}:{topic}/{partition}@", keys=offsets),
            created_ms=timestamp_us // 1000, app_env=self.config.app_env_map.get(topic),
        )
        return out

    async def _publish(self, messages: Batches) -> int:
        """Publish; returns how many the device rejected (counted and logged, never retried)."""
        rejected = await forward(self.host, messages, "rustlog records")
        self.stats.device_rejected += rejected
        return rejected

    async def _forward_backlog(self, topic: str, partition: int, plog: PartitionLog, end: int) -> int:
        sent = 0
        while plog.forwarded < end:
            start = plog.forwarded
            records = [r for r in plog.read(start, FORWARD_CHUNK_BYTES) if r.offset < end]
            if not records:
                break
            messages = self.host.mapper.batches()
            for r in records:
                meta = {"protocol": self.name, "protocol_version": "recovered", "peer": None,
                        "received_at": r.timestamp // 1000}
                self._messages(messages, topic, partition, r.offset, [r.payload], r.timestamp, meta)
            await self._publish(messages)
            self._set_forwarded(plog, records[-1].offset + 1)
            sent += len(records)
        self.stats.records_reforwarded += sent
        return sent

    # -- the session

    async def serve(self, conn: Connection) -> None:
        self.stats.connections_total += 1
        self.stats.connections_active += 1
        try:
            await _Session(self, conn).run()
        finally:
            self.stats.connections_active -= 1

    async def _handle(self, ev: e.Request | e.BadRequest, conn: Connection) -> e.Response:
        self.stats.requests += 1
        try:
            resp = await self._dispatch(ev, conn)
        except TopicNotFound as err:
            resp = e.Error(e.ErrorKind.TOPIC_NOT_FOUND, str(err), {"available_topics": list(self.log.topics())})
        except PartitionNotFound as err:
            resp = e.Error(e.ErrorKind.PARTITION_NOT_FOUND, str(err))
        except StorageError as err:
            self.health.failed(err, "answering writes with an error until it can write")
            resp = e.Error(e.ErrorKind.INSUFFICIENT_SPACE if err.no_space else e.ErrorKind.STORAGE, str(err))
        if isinstance(resp, e.Error):
            self.stats.errors += 1
        return resp

    async def _dispatch(self, ev: e.Request | e.BadRequest, conn: Connection) -> e.Response:
        binary = ev.dialect is e.Dialect.BINARY
        if isinstance(ev, e.Produce):
            return await self._produce(ev, conn)
        if isinstance(ev, e.Fetch):
            return self._fetch(ev)
        if isinstance(ev, e.OffsetCommit):
            try:
                self.log.commit(ev.group, ev.topic, ev.partition, ev.offset)
            except (TopicNotFound, PartitionNotFound) as err:
                if binary:
                    return e.Error(e.ErrorKind.COMMIT_FAILED, f"offset commit failed: {err}")
                return e.OffsetCommitResponse(False)
            except StorageError as err:
                if binary:
                    self.health.failed(err, "answering writes with an error until it can write")
                    return e.Error(e.ErrorKind.COMMIT_FAILED, f"offset commit failed: {err}")
                raise
            return e.OffsetCommitResponse(True)
        if isinstance(ev, e.OffsetFetch):
            if not binary:  # the reference answers "no commit" for unknown topics; JSON says why
                self.log.partition(ev.topic, ev.partition)
            return e.OffsetFetchResponse(self.log.committed(ev.group, ev.topic, ev.partition))
        if isinstance(ev, e.CreateTopic):
            try:
                self.log.create_topic(ev.topic, ev.partition_count)
            except TopicExists as err:
                if binary:
                    return e.Error(e.ErrorKind.TOPIC_EXISTS, str(err))
                return e.CreateTopicResponse(False, 0)
            except BadPartitionCount as err:
                return e.Error(e.ErrorKind.BAD_PARTITION_COUNT, str(err))
            log.info("%s: created topic %s with %d partitions", conn.peer, ev.topic, ev.partition_count)
            return e.CreateTopicResponse(True, ev.partition_count)
        if isinstance(ev, e.ListTopics):
            return e.ListTopicsResponse(tuple(e.TopicInfo(n, c) for n, c in self.log.topics().items()))
        if isinstance(ev, e.DescribeTopic):
            parts = self.log.partitions.get(ev.topic)
            if parts is None:
                kind = e.ErrorKind.DESCRIBE_TOPIC_NOT_FOUND
                return e.Error(kind, f"topic {ev.topic!r} not found", {"available_topics": list(self.log.topics())})
            return e.DescribeTopicResponse(ev.topic, tuple(self._info(i, p) for i, p in enumerate(parts)))
        if isinstance(ev, e.DescribePartition):
            parts = self.log.partitions.get(ev.topic)
            if parts is None or ev.partition >= len(parts):
                kind = e.ErrorKind.DESCRIBE_PARTITION_NOT_FOUND if parts is not None or binary else e.ErrorKind.TOPIC_NOT_FOUND
                return e.Error(kind, f"partition {ev.partition} of topic {ev.topic!r} not found")
            return e.DescribePartitionResponse(ev.topic, self._info(ev.partition, parts[ev.partition]))
        if isinstance(ev, e.MetricsFetch):
            return self.stats.response(self.log, self.health)
        if isinstance(ev, e.Ping):
            return e.Pong()
        if isinstance(ev, e.BadRequest):
            log.info("%s: bad request: %s", conn.peer, ev.message)
            return e.Error(ev.kind, ev.message)
        raise AssertionError(f"unhandled event {ev!r}")

    @staticmethod
    def _info(partition: int, plog: PartitionLog) -> e.PartitionInfo:
        return e.PartitionInfo(partition, plog.high_watermark, plog.log_start_offset, plog.segment_count)

    async def _produce(self, ev: e.Produce, conn: Connection) -> e.Response:
        started = time.perf_counter()
        plog = self.log.partition(ev.topic, ev.partition)
        n = len(ev.records)
        self.host.metrics.events_received.inc(n)
        async with self._lock(ev.topic, ev.partition):
            if plog.forwarded < plog.high_watermark:
                await self._forward_backlog(ev.topic, ev.partition, plog, plog.high_watermark)
            timestamp = now_us()
            always = self.log.config.fsync == "always"
            base = plog.append(ev.records, timestamp, sync=not always)  # nothing stored if it raises
            self.health.succeeded()
            if n:
                messages = self._messages(self.host.mapper.batches(), ev.topic, ev.partition, base, ev.records, timestamp,
                                          conn.metadata(ev.dialect.value))
                # The fsync runs in a thread while the device takes the records: the answer
                # below still waits for both, and the event loop serves other clients meanwhile.
                if always:
                    synced = asyncio.ensure_future(self._sync(plog))
                    try:
                        rejected = await self._publish(messages)
                    finally:
                        await synced
                else:
                    rejected = await self._publish(messages)
                self._set_forwarded(plog, base + n)
                if rejected:
                    return e.Error(e.ErrorKind.INTERNAL,
                                   f"stored at offsets {base}..{base + n - 1}, but the device rejected {rejected} of {n} records")
            elif always:
                await self._sync(plog)
        self.host.metrics.events_acked.inc(n)
        self.stats.records_in += n
        self.stats.bytes_in += sum(map(len, ev.records))
        self.stats.produce.observe(time.perf_counter() - started)
        return e.ProduceResponse(base, n)

    async def _sync(self, plog: PartitionLog) -> None:
        """fsync (the "always" policy) until it works: the records are stored and on their way to the device."""
        while True:
            try:
                await asyncio.to_thread(plog.sync)
                return
            except StorageError as err:
                self.health.failed(err, "holding the Produce until the fsync works")
                await asyncio.sleep(RETRY_EVERY)

    def _set_forwarded(self, plog: PartitionLog, offset: int) -> None:
        """Record that the device has everything below `offset`; failing only costs forwarding again after a crash."""
        try:
            plog.set_forwarded(offset)
        except StorageError as err:
            self.health.failed(err, "the forwarded watermark is behind (a restart forwards those records again)")

    def _fetch(self, ev: e.Fetch) -> e.Response:
        started = time.perf_counter()
        offset = ev.offset
        if ev.dialect is e.Dialect.BINARY and ev.group_id:
            # The reference: a group id means "from the group's committed offset".
            committed = self.log.committed(ev.group_id, ev.topic, ev.partition)
            if committed is None:
                return e.FetchResponse((), 0)
            offset = committed
        plog = self.log.partition(ev.topic, ev.partition)
        start, hw = plog.log_start_offset, plog.high_watermark
        if offset < start or offset > hw:
            if ev.dialect is e.Dialect.BINARY or offset > hw:
                # The reference answers out-of-range with an empty response; the spec
                # answers an offset past the end with an empty one too.
                return e.FetchResponse((), offset)
            return e.Error(
                e.ErrorKind.OFFSET_OUT_OF_RANGE, f"offset {offset} out of range",
                {"valid_range": {"start": start, "end": hw}, "high_watermark": hw},
            )
        # max_bytes is the client's soft limit; the frame limit is ours: a JSON answer costs
        # up to about 3 bytes per stored byte (Base64 plus per-record fields).
        frame = self.host.config.max_frame_size
        cap = frame // 3 if ev.dialect is e.Dialect.JSON else frame - 1024
        try:
            records: list[StoredRecord] = plog.read(offset, min(ev.max_bytes, cap)) if offset < hw else []
        except StorageError as err:
            log.error("fetch from %s/%d failed: %s", ev.topic, ev.partition, err)
            return e.Error(e.ErrorKind.FETCH_FAILED, f"fetch failed: {err}")
        self.stats.records_out += len(records)
        self.stats.bytes_out += sum(len(r.payload) for r in records)
        self.stats.fetch.observe(time.perf_counter() - started)
        next_offset = records[-1].offset + 1 if records else offset
        return e.FetchResponse(tuple(e.FetchedRecord(r.payload, r.offset, r.timestamp) for r in records), next_offset)


class _Session(EngineSession):
    """One client: each request is answered, in order, before the next is read."""

    def __init__(self, bridge: Bridge, conn: Connection) -> None:
        super().__init__(bridge.host, conn, e.RustlogServer(bridge.host.config.max_frame_size))
        self.bridge = bridge

    async def run(self) -> None:
        try:
            await self.read_loop()
        except FrameTimeout:
            raise  # the client stopped sending: nothing to answer
        except RemoteProtocolError as err:
            # The engine's fatal errors: one best-effort Error frame, then the close.
            self.conn.write(self.engine.fatal_reply(err))
            try:
                await self.conn.drain()
            except ConnectionError:
                pass
            raise

    async def on_events(self, events: list[e.Request | e.BadRequest]) -> None:
        conn, engine, handle = self.conn, self.engine, self.bridge._handle
        for event in events:
            conn.write(engine.send(await handle(event, conn)))
        await conn.drain()

    async def after_read(self) -> None:
        """Each answer was drained as it went out."""
