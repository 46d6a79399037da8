"""One importer worker as a pipeline of named stages: receive -> decode -> batch -> write.

- receive: `importer.receive.Receiver` over `logjam.subscriber.Subscriber` (SUB to every device
  it reads: its own under `--own-devices`) and `importer.sequence.Sequencer` (each device in
  sequence order; duplicates dropped; holes filled from replay);
- decode: `importer.decode.BatchBuilder` (a row per message, dedupe by `@metadata._id`), made in
  C a drained chunk at a time by `importer.decode_native.NativeBatchBuilder` when LOGJAM_NATIVE allows;
- batch: `importer.batch.GroupCommit` (group commit, bounded by bytes);
- write: `importer.write.BackgroundWriter` running `importer.commit.Commit`s (one Delta commit per
  batch through delta-rs, in a thread, carrying the positions it covers as app transactions).

Progress lives in the table: a device met for the first time resumes after the seq its
journal's app transaction holds (`TableTarget.landed`), so there is no checkpoint file.
`Worker.start` opens (or creates) the table; `Worker.run` is the loop; both run in the main
thread, the write stage in its own.
"""

from __future__ import annotations

import datetime
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Mapping

import zmq

from importer.batch import Batch, GroupCommit
from importer.commit import TableTarget
from table.delta import recent_event_ids
from importer.decode import BatchBuilder, stream_key
from importer.decode_native import NativeBatchBuilder, NativeRecentKeys, recent_keys
from importer.dedupe import RecentKeys
from importer.metrics import ImporterMetrics
from table.event_time import EventWindow
from table.partitioning import PartitionMap
from logjam.defaults import data_root
from table.paths import OVERFLOW, QUARANTINE, table_path
from importer.receive import Receiver
from importer.report import GapReport, Tally
from importer.sequence import Ledger, Position, Sequencer
from table.session import is_connect, open_session, resolve_warehouse, wait_for_connect_server
from importer.config import ImporterConfig
from importer.split import StreamFilter
from importer.write import BackgroundWriter, WriteFailed, WriteListener
from logjam import sockets
from logjam.curve import ClientKey
from logjam.subscriber import Subscriber
from runtime.ratelimit import RateLimitedLog

log = logging.getLogger("logjam-importer")

# How often each device hears how far this worker has committed (its flow control, devices/lag.py).
REPORT_EVERY = 0.5


class Worker(WriteListener):
    def __init__(self, config: ImporterConfig, stop: threading.Event, metrics: ImporterMetrics,
                 curve: ClientKey | None = None) -> None:
        self.config = config
        self.curve = curve  # for SUB and replay; None: plaintext (--plaintext)
        self.stop = stop
        self.metrics = metrics
        self.worker_id = config.worker_id
        own = config.own_devices
        # Owning whole devices, a worker keeps every stream they carry (prefixes still narrow it).
        self.filter = StreamFilter(None if own else config.worker, None if own else config.workers, config.app_env)
        self.subs = list(config.owned)
        # Progress belongs to the device: an owner of whole devices that lands all their streams resumes
        # after the last row any importer wrote for them. A worker that lands only some streams
        # (prefixes, the CRC split) can trust only its own rows.
        self.resume_scope: int | None = None if own and not config.app_env else self.worker_id
        self.state_dir = Path(config.state_dir) if config.state_dir else data_root() / "importer"
        # Per device, how far this worker's commits have landed (what the devices' flow control hears).
        self.committed_at: dict[int, Position] = {}
        self._committed_lock = threading.Lock()
        self.ledger: Ledger | None = None
        self.dedupe: RecentKeys | NativeRecentKeys | None = None
        self.gaps = GapReport(metrics)
        self.tally = Tally()
        self._stalled = False
        self._next_report = 0.0
        self.ready_at: float | None = None  # monotonic end of start(): the table is there
        self.last_write: float | None = None  # monotonic end of the last committed batch (importer/health.py)
        self.last_quarantine: float | None = None  # monotonic time rows were last quarantined (importer/health.py)
        self.name = f"{socket.gethostname()}/worker-{self.worker_id}"
        self.window = EventWindow.for_retention(config.retention_days)
        # The stages, made by start() and run(): write (commit, retry), batch, receive.
        self.location: str | None = None
        self.target: TableTarget | None = None
        self.group_commit: GroupCommit | None = None
        self.writer: BackgroundWriter | None = None
        self.sub: Subscriber | None = None
        self.sequencer: Sequencer | None = None
        self.receiver: Receiver | None = None
        # One line per stream and batch whose event times were out of the window, a few a minute at most.
        self._warn_out_of_window = RateLimitedLog(burst=10, period=60.0)

    # -- start-up -----------------------------------------------------------------------------
    def warehouse(self) -> str | None:
        """--warehouse, else the Spark server's warehouse dir (None: stopped while waiting for it)."""
        config = self.config
        if config.warehouse:
            return resolve_warehouse(None, config.warehouse)
        if is_connect(config.spark) and not wait_for_connect_server(config.spark, self.stop):
            return None
        spark = open_session(config.spark, app_name=f"logjam-importer-{self.worker_id}")
        try:
            return resolve_warehouse(spark, None)
        finally:
            if is_connect(config.spark):
                spark.stop()

    def start(self) -> int | None:
        """Open or create the table and learn what it holds; an exit status if that failed."""
        config = self.config
        started = time.monotonic()
        warehouse = self.warehouse()
        if warehouse is None:
            return 0
        self.location = table_path(warehouse)
        partition_map = PartitionMap(self.worker_id, max_new=config.max_new_app_envs, on_overflow=self._overflowed)
        self.target = TableTarget(self.location, self.worker_id, scope=self.resume_scope, partition_map=partition_map,
                                  scratch=self.state_dir / f"probe-{self.worker_id}")
        log.info("writing %s.messages at %s (Delta version %d) in %.1fs; progress of %s", config.database,
                 self.location, self.target.writer.table.version(), time.monotonic() - started, self._scope_name())
        if not config.no_replay:
            self.ledger = Ledger()
        if config.dedupe_keys > 0:
            self._load_event_ids()
        self.ready_at = time.monotonic()
        return None

    def _scope_name(self) -> str:
        return "each device, shared by every importer" if self.resume_scope is None else \
            f"importer {self.resume_scope}'s share of each device"

    def _load_event_ids(self) -> None:
        self.dedupe = recent_keys(self.config.dedupe_keys)  # in C unless LOGJAM_NATIVE=off
        loading = time.monotonic()
        assert self.target is not None
        ids = recent_event_ids(self.target.writer.table, self.config.dedupe_keys)
        loaded = self.dedupe.extend(stream_key(a, i) for a, i in ids)
        log.info("dedupe: remembering up to %d event ids; %d loaded from the table's newest rows in %.1fs",
                 self.config.dedupe_keys, loaded, time.monotonic() - loading)

    # -- what the write stage reports (importer.write.WriteListener) ------------------------------------------------------------------
    def _overflowed(self, app_env: str, date: str) -> None:
        self.metrics.overflowed_app_envs.inc()
        overflowed = self.target.map.overflowed
        if overflowed == 1 or overflowed % 1000 == 0:
            log.warning("worker %d has %d partitions on %s (--max-new-app-envs): new streams that day, %r the "
                        "latest (%d so far), land in app_env '%s' with their name in original_app_env",
                        self.worker_id, self.config.max_new_app_envs, date, app_env, overflowed, OVERFLOW)

    def quarantined(self, batch: Batch, pairs: frozenset[tuple[str, str]]) -> None:
        self.last_quarantine = time.monotonic()
        rows = sum(1 for a, d in zip(batch.table.column("app_env").to_pylist(), batch.table.column("date").to_pylist())
                   if (a, d.isoformat()) in pairs)
        self.metrics.quarantined_rows.inc(rows)
        log.error("%d rows of %s landed in app_env '%s' (quarantine) instead of their own partitions", rows,
                  ", ".join(f"{a}/{d}" for a, d in sorted(pairs)[:5]), QUARANTINE)

    def written(self, batch: Batch, seconds: float) -> None:
        m = self.metrics
        self.last_write = time.monotonic()
        m.last_write.set_to_current_time()
        m.written.inc(batch.rows)
        m.batches.inc()
        m.write_seconds.observe(seconds)
        m.batch_rows.observe(batch.rows)
        m.batch_bytes.observe(batch.bytes)
        m.commit_delay.observe(time.monotonic() - batch.opened)
        log.debug("wrote %d rows (%d bytes) in %.2fs", batch.rows, batch.bytes, seconds)

    def write_failed(self, error: BaseException) -> None:
        self.metrics.write_failures.inc()

    def committed(self, batch: Batch) -> None:
        # Writer thread: this batch and every earlier one are in the table.
        if batch.mark is not None:
            self._advance(batch.mark)

    def _advance(self, mark: Mapping[int, Position]) -> None:
        """Move the committed positions forward to `mark` (within a journal the maximum wins)."""
        with self._committed_lock:
            for device, position in mark.items():
                old = self.committed_at.get(device)
                if old is None or old.journal != position.journal or position.seq > old.seq:
                    self.committed_at[device] = position
                    self.metrics.checkpoint_seq.labels(self.metrics.worker, str(device)).set(position.seq)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> int:
        config = self.config
        # Rows made in C a drained chunk at a time when LOGJAM_NATIVE allows, else by the Python reference.
        native = NativeBatchBuilder.load(dedupe=self.dedupe, window=self.window)
        builder = native if native is not None else BatchBuilder(dedupe=self.dedupe, window=self.window)
        self.group_commit = GroupCommit(builder, flush_interval=config.flush_interval, batch_bytes=config.batch_bytes,
                                 batch_rows=config.batch_rows)
        assert self.target is not None
        self.writer = BackgroundWriter(self.target, listener=self, stop=self.stop)
        ctx = zmq.Context()
        self.sub = Subscriber(self.subs, context=ctx, rcvhwm=config.rcvhwm, curve=self.curve)
        self.sequencer = None if self.ledger is None else Sequencer(
            self.ledger, self.metrics, context=ctx, device_endpoint=self.sub.device_endpoint,
            replay_port=config.replay_port, replay_timeout=config.replay_timeout, stopping=self.stop.is_set,
            curve=self.curve, replay_ports=config.replay_port_of, between=self._commit_due, landed=self.target.landed)
        self.receiver = Receiver(self.group_commit, self.filter, self.tally, self.gaps, self.sequencer,
                                 self.sub.device_endpoint)
        share = f"worker {config.worker} of {config.workers}" if config.workers else "all streams"
        if config.own_devices:
            share += f", owning {len(self.subs)} of {len(config.subs)} devices"
        log.info("subscribed to %s (%s%s)", ", ".join(self.subs), share,
                 f", prefixes {', '.join(config.app_env)}" if config.app_env else "")
        status = 0
        try:
            with sockets.eterm_is_clean():
                self._loop()
            log.info("stopping: flushing %d buffered rows", self.group_commit.rows)
            self.flush()
        except WriteFailed as e:
            log.error("%s", e)
            status = 1
        finally:
            status = self._shutdown(ctx, status)
        return status

    def _loop(self) -> None:
        writer, batch, stop = self.writer, self.group_commit, self.stop
        while not stop.is_set():
            if batch.full() and not writer.has_room:
                self._wait_for_room()
                continue
            deadline = batch.deadline()
            wait = 0.2 if deadline is None else max(0.001, min(0.2, deadline - time.monotonic()))
            batches = self.sub.recv_raw(timeout=wait)
            if batches:
                self.receiver.receive(batches, stop.is_set)
                self.tally.publish(self.metrics)
            if batch.due(writer.idle) and (writer.idle or writer.has_room):
                self.flush()
            self._housekeeping()

    def _wait_for_room(self) -> None:
        # Back-pressure: a full batch waits for the writer; the SUB socket buffers meanwhile.
        writer = self.writer
        writer.done.clear()
        if not writer.has_room:
            writer.done.wait(0.2)
        self._housekeeping()

    def _commit_due(self) -> None:
        """Between two replayed messages: what the loop does between two receives. A replay runs
        inside one receive, and would otherwise be one batch, committed only at its end."""
        writer, batch = self.writer, self.group_commit
        while batch.full() and not writer.has_room and not self.stop.is_set():
            self._wait_for_room()
        if batch.due(writer.idle) and (writer.idle or writer.has_room):
            self.flush()

    def flush(self) -> None:
        """Cut the open batch and hand it to the writer."""
        batch = self.group_commit.cut(self.ledger.snapshot() if self.ledger is not None else None)
        self._out_of_window()
        if batch is None:
            return
        ok = self.writer.submit(batch)
        self.metrics.pending_batches.set(self.writer.pending)
        if not ok:
            raise WriteFailed("the table writer thread died")

    def _out_of_window(self) -> None:
        """Count and report the rows of the batch just cut that were filed under the day they arrived."""
        for app_env, (rows, low, high) in self.group_commit.builder.take_out_of_window().items():
            self.metrics.out_of_window.labels(self.metrics.worker, app_env).inc(rows)
            self._warn_out_of_window(
                "%s: %d events with a time outside %s (created_at %s .. %s) are filed under the day they "
                "arrived, with created_out_of_window = true", app_env, rows, self.window.describe(),
                _iso(low), _iso(high))

    def _housekeeping(self) -> None:
        self._watch_writer()
        self._idle_progress()
        now = time.monotonic()
        if self.sequencer is not None and now >= self._next_report:
            self._next_report = now + REPORT_EVERY
            with self._committed_lock:
                committed = dict(self.committed_at)
            self.sequencer.report(committed, self.name)
        self.metrics.reconnects.set(self.sub.reconnects)
        self.metrics.pending_batches.set(self.writer.pending)
        self.gaps.maybe_log()

    def _watch_writer(self) -> None:
        started = self.writer.started
        stalled = started is not None and time.monotonic() - started > self.config.write_timeout
        self.metrics.write_stalled.set(1 if stalled else 0)
        if stalled and not self._stalled:
            log.error("a commit has been under way for %.0fs (--write-timeout); the table's store is not answering",
                      time.monotonic() - started)
            self.metrics.write_stalls.inc()
        elif self._stalled and not stalled:
            log.info("commits are making progress again")
        self._stalled = stalled

    def _idle_progress(self) -> None:
        # Filtered-out messages (heartbeats, other workers' streams) are covered without a row: with
        # no batch open or in flight, everything covered is settled, and the devices' flow control
        # must hear so, or an idle stream's heartbeats would look like a lagging importer.
        if self.ledger is None or self.group_commit.rows or self.writer.pending or self.writer.failed:
            return
        self._advance(self.ledger.snapshot())

    def _shutdown(self, ctx: zmq.Context, status: int) -> int:
        self.sub.close()
        if self.sequencer is not None:
            self.sequencer.close()
        ctx.term()
        try:
            self.writer.close()
        except WriteFailed as e:
            self.metrics.lost_rows.inc(self.writer.lost_rows)
            log.error("%s", e)
            status = 1
        self.gaps.maybe_log(force=True)
        gaps = dict(self.gaps.total)
        if self.sequencer is not None:
            for device, n in self.sequencer.gap_total.items():
                gaps[device] = gaps.get(device, 0) + n
        log.info("wrote %d rows; %d parse errors; gaps per device: %s; duplicates dropped per device: %s; "
                 "duplicate events skipped: %d", self.writer.written_rows, self.group_commit.builder.parse_errors,
                 gaps or "none", (self.ledger.duplicates if self.ledger is not None else None) or "none",
                 self.group_commit.builder.duplicates)
        log.info("committed: %s", {d: p.seq for d, p in self.committed_at.items()} or "nothing")
        return status


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _iso(us: int) -> str:
    # created_at is always between the epoch and the end of year 9999 (importer/decode.py).
    return (_EPOCH + datetime.timedelta(microseconds=us)).isoformat(timespec="seconds")
