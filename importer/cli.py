"""`logjam-importer`: subscribe to devices, decode every message, and append batches to Spark.

Worker I of N (`--worker I --workers N`) keeps the streams whose app-env CRC32 is I
modulo N and writes them under `<warehouse>/messages/importer=<I>/`. It subscribes to
everything and filters after receipt so that its gap tracking sees every sequence number.
Batches flush at `--batch-rows` rows or `--flush-interval` seconds; SIGTERM flushes the
current batch and exits 0.

With recovery on (the default; `--no-replay` turns it off) the importer keeps a checkpoint
per device in `--state-dir`, drops duplicates, and fills every hole in a device's sequence
(a gap, or everything since the checkpoint at start) from the device's replay endpoint
before going on; see docs/reliability.md "Importer recovery".

Events the device journaled twice (two seqs, one `@metadata._id`) are written once: the
worker remembers the last `--dedupe-keys` event ids it wrote, reloaded from its own root on
start, and skips a message whose id it has seen (docs/reliability.md "Exactly once").
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Sequence

import zmq

from importer.decode import DUPLICATE_EVENT, BatchBuilder, stream_key
from importer.dedupe import DEFAULT_CAPACITY, RecentKeys
from importer.metrics import ImporterMetrics
from importer.paths import output_root
from importer.recovery import (DUPLICATE, HOLE, Checkpoints, Ledger, default_state_dir, new_session_id,
                               quiesce_previous_session, replay_endpoint)
from importer.split import StreamFilter
from importer.writer import DEFAULT_SPARK, BackgroundWriter, WriteFailed, is_connect, open_session, resolve_warehouse
from logjam import lifecycle
from logjam.config import add_config_flag, parse_args, setup_logging
from logjam.errors import ProtocolError
from logjam.message import Message
from logjam.replay import Lost, ReplayClient, ReplayTimeout
from logjam.subscriber import Gap, Subscriber

log = logging.getLogger("logjam-importer")

DEFAULT_SUB = "tcp://127.0.0.1:9606"
GAP_REPORT_INTERVAL = 5.0
DEFAULT_REPLAY_PORT = 9607
# After a replay endpoint did not answer, gaps of that device are counted, not fetched, for this long.
REPLAY_RETRY_AFTER = 30.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="logjam-importer", description=__doc__.splitlines()[0])
    p.add_argument("--sub", action="append", metavar="tcp://HOST:PORT",
                   help=f"device PUB endpoint; repeatable (default {DEFAULT_SUB})")
    p.add_argument("--spark", default=DEFAULT_SPARK, metavar="URL",
                   help="sc://HOST:PORT (Spark Connect), local[*] or spark://HOST:PORT (classic session)")
    p.add_argument("--warehouse", metavar="DIR",
                   help="warehouse root as the Spark server sees it (default: the server's spark.sql.warehouse.dir)")
    p.add_argument("--worker", type=int, metavar="I", help="this worker's number, 0..N-1")
    p.add_argument("--workers", type=int, metavar="N", help="number of workers sharing the streams")
    p.add_argument("--app-env", action="append", metavar="PREFIX", help="only streams starting with PREFIX; repeatable")
    p.add_argument("--batch-rows", type=int, default=50_000, help="flush a batch at this many rows")
    p.add_argument("--flush-interval", type=float, default=2.0, help="flush a non-empty batch after this many seconds")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (default off)")
    p.add_argument("--rcvhwm", type=int, default=100_000, help="SUB receive high-water mark (messages)")
    p.add_argument("--queue-depth", type=int, default=1, help="built batches that may wait for Spark (1-2)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="where checkpoints are kept (default $LOGJAM_DATA_DIR/importer, else ./data/importer)")
    p.add_argument("--replay-port", type=int, default=DEFAULT_REPLAY_PORT,
                   help="devices' replay port, on the host of the --sub endpoint (default 9607)")
    p.add_argument("--replay-timeout", type=float, default=10.0, help="seconds to wait for a replay answer")
    p.add_argument("--no-replay", action="store_true",
                   help="no checkpoints and no replay: gaps are only counted (devices without --data-dir)")
    p.add_argument("--dedupe-keys", type=int, default=DEFAULT_CAPACITY, metavar="N",
                   help=f"remember the last N event ids (@metadata._id) written and skip repeats; 0 turns it off "
                        f"(default {DEFAULT_CAPACITY})")
    p.add_argument("-v", "--verbose", action="store_true")
    add_config_flag(p)
    return p


def wait_for_connect_server(url: str, stop: threading.Event) -> bool:
    """Poll the Connect endpoint's TCP port so a missing server means waiting, not a long client retry loop."""
    parsed = urllib.parse.urlparse(url.split(";", 1)[0])
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 15002
    warned = False
    while not stop.is_set():
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            if not warned:
                log.info("waiting for the Spark Connect server at %s:%d", host, port)
                warned = True
            stop.wait(0.5)
    return False


class GapReport:
    """Gap counts per device and skipped duplicate events, logged as a summary at most every few seconds
    (both come in floods)."""

    def __init__(self, metrics: ImporterMetrics) -> None:
        self.metrics = metrics
        self.total: dict[int, int] = {}
        self.recent: dict[int, int] = {}
        self.duplicate_events = 0
        self._reported_duplicates = 0
        self._next = time.monotonic() + GAP_REPORT_INTERVAL

    def gap(self, gap: Gap) -> None:
        device = str(gap.device)
        if gap.restart:
            self.metrics.device_restarts.labels(self.metrics.worker, device).inc()
            log.warning("device %d restarted or wrapped: sequence went from %d to %d", gap.device, gap.first, gap.last)
            return
        self.metrics.gap_messages.labels(self.metrics.worker, device).inc(gap.lost)
        self.total[gap.device] = self.total.get(gap.device, 0) + gap.lost
        self.recent[gap.device] = self.recent.get(gap.device, 0) + gap.lost

    def maybe_log(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + GAP_REPORT_INTERVAL
        for device, lost in sorted(self.recent.items()):
            log.warning("gaps: device %d lost %d messages in the last %.0fs (%d in total)",
                        device, lost, GAP_REPORT_INTERVAL, self.total[device])
        self.recent.clear()
        if self.duplicate_events > self._reported_duplicates:
            log.info("duplicates: skipped %d events whose @metadata._id was already written in the last %.0fs "
                     "(%d in total)", self.duplicate_events - self._reported_duplicates, GAP_REPORT_INTERVAL,
                     self.duplicate_events)
            self._reported_duplicates = self.duplicate_events


def table_max_seqs(spark: Any, root: str) -> dict[int, int]:
    """max(seq) per device in this worker's own output root ({} before its first commit)."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    try:
        rows = spark.read.parquet(root).groupBy("device").agg(F.max("seq").alias("seq")).collect()
    except AnalysisException as e:
        if "PATH_NOT_FOUND" in str(e) or "UNABLE_TO_INFER_SCHEMA" in str(e):
            return {}
        raise
    return {int(r["device"]): int(r["seq"]) for r in rows if r["seq"] is not None}


def recent_event_keys(spark: Any, root: str, limit: int) -> list[str]:
    """The stream-scoped event ids of the newest `limit` rows with one in this worker's own root, oldest first.

    The explicit schema reads files written before the `event_id` column existed as NULLs (no
    keys) instead of depending on which file Spark would infer the schema from.
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    try:
        df = spark.read.schema("event_id STRING, ingested_at TIMESTAMP, app_env STRING").parquet(root)
        table = (df.where(F.col("event_id").isNotNull()).orderBy(F.col("ingested_at").desc()).limit(limit)
                 .select("app_env", "event_id").toArrow())
    except AnalysisException as e:
        if "PATH_NOT_FOUND" in str(e) or "UNABLE_TO_INFER_SCHEMA" in str(e):
            return []
        raise
    app_envs, ids = table.column("app_env").to_pylist(), table.column("event_id").to_pylist()
    return [stream_key(a, i) for a, i in zip(reversed(app_envs), reversed(ids))]


class Tally:
    """Counts of one receive batch, added to the Prometheus metrics at once (a lock per increment is dear)."""

    __slots__ = ("received", "skipped", "duplicates", "rows", "errors", "duplicate_events")

    def __init__(self) -> None:
        self.received = self.skipped = self.duplicates = 0
        self.rows: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.duplicate_events: dict[str, int] = {}

    def publish(self, metrics: ImporterMetrics) -> None:
        metrics.received.inc(self.received)
        metrics.skipped.inc(self.skipped)
        for app_env, n in self.rows.items():
            metrics.rows.labels(metrics.worker, app_env).inc(n)
        for app_env, n in self.errors.items():
            metrics.parse_errors.labels(metrics.worker, app_env).inc(n)
        for app_env, n in self.duplicate_events.items():
            metrics.duplicate_events.labels(metrics.worker, app_env).inc(n)
        self.__init__()


def run(args: argparse.Namespace) -> int:
    stop = lifecycle.stop_event()
    worker_id = args.worker if args.worker is not None else 0
    filt = StreamFilter(args.worker, args.workers, args.app_env or ())
    metrics = ImporterMetrics(worker_id)
    if args.metrics_port:
        metrics.serve(args.metrics_port)

    if is_connect(args.spark) and not wait_for_connect_server(args.spark, stop):
        return 0
    started = time.monotonic()
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
    session_id: str | None = None
    if not args.no_replay and is_connect(args.spark):
        previous, session_id = new_session_id(state_dir, worker_id)
        if previous is not None:
            quiesce_previous_session(lambda: open_session(args.spark, session_id=previous))

    def connect() -> Any:
        return open_session(args.spark, app_name=f"logjam-importer-{worker_id}", warehouse=args.warehouse,
                            session_id=session_id)

    spark = connect()
    warehouse = resolve_warehouse(spark, args.warehouse)
    root = output_root(warehouse, worker_id)
    log.info("spark %s ready in %.1fs; writing to %s", args.spark, time.monotonic() - started, root)

    ledger: Ledger | None = None
    checkpoints: Checkpoints | None = None
    in_table: dict[int, int] | None = None
    if not args.no_replay:
        checkpoints = Checkpoints(state_dir, worker_id)
        try:
            saved = checkpoints.load()
        except ValueError as e:
            log.error("cannot start: %s (remove it to start from the table's max seq)", e)
            return 1
        in_table = table_max_seqs(spark, root)
        resume = {d: max(saved.get(d, -1), in_table.get(d, -1)) for d in saved.keys() | in_table.keys()}
        ledger = Ledger(resume)
        for device, seq in resume.items():
            metrics.checkpoint_seq.labels(metrics.worker, str(device)).set(seq)
        log.info("recovery on (state %s, replay port %d); resuming after %s", checkpoints.path, args.replay_port,
                 ", ".join(f"device {d}: seq {resume[d]} (checkpoint {saved.get(d, '-')}, table {in_table.get(d, '-')})"
                           for d in sorted(resume)) or "nothing (no checkpoint, empty table)")

    dedupe: RecentKeys | None = None
    if args.dedupe_keys > 0:
        # After the previous session was quiesced, like max(seq): its last write is in the table or never will be.
        dedupe = RecentKeys(args.dedupe_keys)
        loading = time.monotonic()
        # An empty root (known from max(seq) when recovery is on) has no keys; skip the second read.
        loaded = dedupe.extend(recent_event_keys(spark, root, args.dedupe_keys)) if in_table != {} else 0
        log.info("dedupe: remembering up to %d event ids; %d loaded from %s in %.1fs",
                 args.dedupe_keys, loaded, root, time.monotonic() - loading)

    def written(rows: int, seconds: float) -> None:
        metrics.written.inc(rows)
        metrics.batches.inc()
        metrics.write_seconds.observe(seconds)
        log.debug("wrote %d rows in %.2fs", rows, seconds)

    def committed(mark: dict[int, int] | None) -> None:
        # Writer thread: this batch and every earlier one are committed, so `mark` is safe to persist.
        if mark is not None and checkpoints is not None:
            try:
                publish_checkpoint(checkpoints.advance(mark))
            except OSError as e:
                # Not fatal: the resume point also comes from the table's max(seq).
                log.error("cannot write the checkpoint %s: %s", checkpoints.path, e)

    def publish_checkpoint(state: dict[int, int] | None) -> None:
        for device, seq in (state or {}).items():
            metrics.checkpoint_seq.labels(metrics.worker, str(device)).set(seq)

    writer = BackgroundWriter(connect, root, depth=max(1, args.queue_depth), on_written=written,
                              on_failure=lambda e: metrics.write_failures.inc(), on_committed=committed, stop=stop)
    writer.spark = spark

    ctx = zmq.Context()
    sub = Subscriber(args.sub or [DEFAULT_SUB], context=ctx, rcvhwm=args.rcvhwm)
    gaps = GapReport(metrics)
    builder = BatchBuilder(dedupe=dedupe)
    share = f"worker {args.worker} of {args.workers}" if args.workers else "all streams"
    log.info("subscribed to %s (%s%s)", ", ".join(args.sub or [DEFAULT_SUB]), share,
             f", prefixes {', '.join(args.app_env)}" if args.app_env else "")

    deadline: float | None = None
    tally = Tally()
    replay_clients: dict[int, ReplayClient] = {}
    replay_down_until: dict[int, float] = {}
    next_idle_checkpoint = 0.0

    def flush() -> None:
        nonlocal deadline
        deadline = None
        if not len(builder):
            return
        table = builder.build()
        ok = writer.submit(table, ledger.snapshot() if ledger is not None else None)
        metrics.pending_batches.set(writer.pending)
        if not ok:
            raise WriteFailed("the Spark writer thread died")

    def handle(msg: Message, ingested_us: int) -> None:
        """One message in sequence order: into the batch, or filtered out."""
        nonlocal deadline
        tally.received += 1
        if msg.is_heartbeat:
            return
        app_env = msg.app_env
        if not filt.keeps(app_env):
            tally.skipped += 1
            return
        error = builder.add(msg, ingested_us)
        if error is DUPLICATE_EVENT:
            # Like a filtered-out message: its seq is covered, no row is written.
            tally.duplicate_events[app_env] = tally.duplicate_events.get(app_env, 0) + 1
            gaps.duplicate_events += 1
            return
        tally.rows[app_env] = tally.rows.get(app_env, 0) + 1
        if error is not None:
            tally.errors[app_env] = tally.errors.get(app_env, 0) + 1
            log.debug("%s seq %d: %s", app_env, msg.meta.seq, error)
        if deadline is None:
            deadline = time.monotonic() + args.flush_interval
        if len(builder) >= args.batch_rows:
            tally.publish(metrics)
            flush()

    def fill(device: int, first: int, last: int) -> None:
        """Fetch `first`..`last` of `device` from its replay endpoint and hand it on in order."""
        assert ledger is not None
        label = str(device)
        client = replay_clients.get(device)
        if client is None and time.monotonic() >= replay_down_until.get(device, 0.0):
            endpoint = sub.device_endpoint.get(device)
            if endpoint is not None:
                client = replay_clients[device] = ReplayClient(replay_endpoint(endpoint, args.replay_port),
                                                              context=ctx, timeout=args.replay_timeout)
        replayed = 0
        try:
            if client is None:
                raise ReplayTimeout("replay is unavailable")
            for item in client.fetch(first, last):
                if isinstance(item, Lost):
                    metrics.lost_messages.labels(metrics.worker, label).inc(item.count)
                    log.error("device %d: seqs %d..%d are gone from its journal (retention): %d messages lost",
                              device, item.first, item.last, item.count)
                    ledger.cover(device, item.last)
                    continue
                seq = item.meta.seq
                if seq <= ledger.covered.get(device, -1) or item.meta.device != device:
                    continue
                ledger.cover(device, seq)
                replayed += 1
                handle(item, time.time_ns() // 1000)
                if stop.is_set():
                    return  # SIGTERM mid-replay: what was covered gets flushed; the rest comes next start
        except (ReplayTimeout, ProtocolError, ValueError) as e:
            # Without an answer there is nothing to wait for: count the rest as a gap and go on.
            replay_clients.pop(device, None)
            if client is not None:
                client.close()
            replay_down_until[device] = time.monotonic() + REPLAY_RETRY_AFTER
            log.warning("device %d: replay of %d..%d failed (%s); not asking again for %.0fs",
                        device, first, last, e, REPLAY_RETRY_AFTER)
        finally:
            metrics.replayed.labels(metrics.worker, label).inc(replayed)
        covered = ledger.covered.get(device, -1)
        if covered < last:
            missing = last - covered
            metrics.gap_messages.labels(metrics.worker, label).inc(missing)
            gaps.total[device] = gaps.total.get(device, 0) + missing
            log.error("device %d: %d messages (%d..%d) could not be replayed and are lost", device, missing,
                      covered + 1, last)
            ledger.cover(device, last)
        else:
            metrics.recovered_gaps.labels(metrics.worker, label).inc()
            log.info("device %d: replayed %d messages (%d..%d)", device, replayed, first, last)

    def idle_checkpoint() -> None:
        # Filtered-out messages (heartbeats, other workers' streams) move the checkpoint too,
        # but only when no batch is open or in flight: then everything covered is settled.
        nonlocal next_idle_checkpoint
        if ledger is None or checkpoints is None or len(builder) or writer.pending or writer.failed:
            return
        now = time.monotonic()
        if now < next_idle_checkpoint:
            return
        next_idle_checkpoint = now + 1.0
        try:
            publish_checkpoint(checkpoints.advance(ledger.snapshot()))
        except OSError as e:
            log.error("cannot write the checkpoint %s: %s", checkpoints.path, e)

    status = 0
    try:
        with lifecycle.eterm_is_clean():
            while not stop.is_set():
                wait = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
                items = sub.recv_batch(1000, timeout=wait or 0.001)
                if not items:
                    if deadline is not None and time.monotonic() >= deadline:
                        flush()
                    idle_checkpoint()
                    gaps.maybe_log()
                    continue
                ingested_us = time.time_ns() // 1000
                for item in items:
                    if isinstance(item, Gap):
                        if ledger is None:
                            gaps.gap(item)
                        continue
                    if ledger is not None:
                        device, seq = item.meta.device, item.meta.seq
                        verdict = ledger.classify(device, seq)
                        if verdict == DUPLICATE:
                            tally.duplicates += 1
                            metrics.duplicates.labels(metrics.worker, str(device)).inc()
                            continue
                        if verdict == HOLE:
                            fill(device, ledger.covered[device] + 1, seq - 1)
                            if stop.is_set():
                                break
                        ledger.cover(device, seq)
                    handle(item, ingested_us)
                tally.publish(metrics)
                if deadline is not None and time.monotonic() >= deadline:
                    flush()
                idle_checkpoint()
                metrics.reconnects.set(sub.reconnects)
                gaps.maybe_log()
        log.info("stopping: flushing %d buffered rows", len(builder))
        flush()
    except WriteFailed as e:
        log.error("%s", e)
        status = 1
    finally:
        sub.close()
        for client in replay_clients.values():
            client.close()
        ctx.term()
        try:
            writer.close()
        except WriteFailed as e:
            metrics.lost_rows.inc(writer.lost_rows)
            log.error("%s", e)
            status = 1
        if status == 0 and ledger is not None and checkpoints is not None and not writer.failed:
            publish_checkpoint(checkpoints.advance(ledger.snapshot()))
        gaps.maybe_log(force=True)
        log.info("wrote %d rows; %d parse errors; gaps per device: %s; duplicates dropped per device: %s; "
                 "duplicate events skipped: %d",
                 writer.written_rows, builder.parse_errors, gaps.total or "none",
                 (ledger.duplicates if ledger is not None else None) or "none", builder.duplicates)
        if checkpoints is not None:
            log.info("checkpoints: %s", checkpoints.seqs or "none")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    setup_logging("logjam-importer", args.verbose)
    try:
        StreamFilter(args.worker, args.workers, args.app_env or ())
    except ValueError as e:
        parser.error(str(e))
    if args.batch_rows < 1 or args.flush_interval <= 0:
        parser.error("--batch-rows and --flush-interval must be positive")
    if args.dedupe_keys < 0:
        parser.error("--dedupe-keys must be 0 (off) or positive")
    lifecycle.exit_skipping_atexit(run(args))


if __name__ == "__main__":
    sys.exit(main())
