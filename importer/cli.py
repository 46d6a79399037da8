"""`logjam-importer`: subscribe to devices, decode every message, and append batches to Spark.

Worker I of N (`--worker I --workers N`) keeps the streams whose app-env CRC32 is I
modulo N and writes them under `<warehouse>/messages/importer=<I>/`. It subscribes to
everything and filters after receipt so that its gap tracking sees every sequence number.
Batches flush at `--batch-rows` rows or `--flush-interval` seconds; SIGTERM flushes the
current batch and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import threading
import time
import urllib.parse
from typing import Any, Sequence

import zmq

from importer.decode import BatchBuilder
from importer.metrics import ImporterMetrics
from importer.paths import output_root
from importer.split import StreamFilter
from importer.writer import DEFAULT_SPARK, BackgroundWriter, WriteFailed, is_connect, open_session, resolve_warehouse
from logjam import lifecycle
from logjam.config import add_config_flag, parse_args, setup_logging
from logjam.subscriber import Gap, Subscriber

log = logging.getLogger("logjam-importer")

DEFAULT_SUB = "tcp://127.0.0.1:9606"
GAP_REPORT_INTERVAL = 5.0


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
    """Gap counts per device, logged as a summary at most every few seconds (gaps come in floods)."""

    def __init__(self, metrics: ImporterMetrics) -> None:
        self.metrics = metrics
        self.total: dict[int, int] = {}
        self.recent: dict[int, int] = {}
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

    def connect() -> Any:
        return open_session(args.spark, app_name=f"logjam-importer-{worker_id}", warehouse=args.warehouse)

    spark = connect()
    warehouse = resolve_warehouse(spark, args.warehouse)
    root = output_root(warehouse, worker_id)
    log.info("spark %s ready in %.1fs; writing to %s", args.spark, time.monotonic() - started, root)

    def written(rows: int, seconds: float) -> None:
        metrics.written.inc(rows)
        metrics.batches.inc()
        metrics.write_seconds.observe(seconds)
        log.debug("wrote %d rows in %.2fs", rows, seconds)

    writer = BackgroundWriter(connect, root, depth=max(1, args.queue_depth), on_written=written,
                              on_failure=lambda e: metrics.write_failures.inc(), stop=stop)
    writer.spark = spark

    ctx = zmq.Context()
    sub = Subscriber(args.sub or [DEFAULT_SUB], context=ctx, rcvhwm=args.rcvhwm)
    gaps = GapReport(metrics)
    builder = BatchBuilder()
    share = f"worker {args.worker} of {args.workers}" if args.workers else "all streams"
    log.info("subscribed to %s (%s%s)", ", ".join(args.sub or [DEFAULT_SUB]), share,
             f", prefixes {', '.join(args.app_env)}" if args.app_env else "")

    deadline: float | None = None

    def flush() -> bool:
        nonlocal deadline
        deadline = None
        if not len(builder):
            return True
        table = builder.build()
        ok = writer.submit(table)
        metrics.pending_batches.set(writer.pending)
        return ok

    def count(received: int, skipped: int, rows: dict[str, int], errors: dict[str, int]) -> None:
        metrics.received.inc(received)
        metrics.skipped.inc(skipped)
        for app_env, n in rows.items():
            metrics.rows.labels(metrics.worker, app_env).inc(n)
        for app_env, n in errors.items():
            metrics.parse_errors.labels(metrics.worker, app_env).inc(n)

    status = 0
    try:
        with lifecycle.eterm_is_clean():
            while not stop.is_set():
                wait = 0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))
                items = sub.recv_batch(1000, timeout=wait or 0.001)
                if not items:
                    if deadline is not None and time.monotonic() >= deadline and not flush():
                        raise WriteFailed("the Spark writer thread died")
                    gaps.maybe_log()
                    continue
                ingested_us = time.time_ns() // 1000
                # Metrics are counted locally and added once per receive batch: prometheus_client
                # takes a lock per increment, which would cost more than decoding a row.
                received = skipped = 0
                rows: dict[str, int] = {}
                errors: dict[str, int] = {}
                for item in items:
                    if isinstance(item, Gap):
                        gaps.gap(item)
                        continue
                    received += 1
                    if item.is_heartbeat:
                        continue
                    app_env = item.app_env
                    if not filt.keeps(app_env):
                        skipped += 1
                        continue
                    error = builder.add(item, ingested_us)
                    rows[app_env] = rows.get(app_env, 0) + 1
                    if error is not None:
                        errors[app_env] = errors.get(app_env, 0) + 1
                        log.debug("%s seq %d: %s", app_env, item.meta.seq, error)
                    if deadline is None:
                        deadline = time.monotonic() + args.flush_interval
                    if len(builder) >= args.batch_rows:
                        count(received, skipped, rows, errors)
                        received = skipped = 0
                        rows.clear()
                        errors.clear()
                        if not flush():
                            raise WriteFailed("the Spark writer thread died")
                count(received, skipped, rows, errors)
                if deadline is not None and time.monotonic() >= deadline and not flush():
                    raise WriteFailed("the Spark writer thread died")
                metrics.reconnects.set(sub.reconnects)
                gaps.maybe_log()
        log.info("stopping: flushing %d buffered rows", len(builder))
        flush()
    except WriteFailed as e:
        log.error("%s", e)
        status = 1
    finally:
        sub.close()
        ctx.term()
        try:
            writer.close()
        except WriteFailed as e:
            metrics.lost_rows.inc(writer.lost_rows)
            log.error("%s", e)
            status = 1
        gaps.maybe_log(force=True)
        log.info("wrote %d rows; %d parse errors; gaps per device: %s", writer.written_rows, builder.parse_errors,
                 gaps.total or "none")
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
    lifecycle.exit_skipping_atexit(run(args))


if __name__ == "__main__":
    sys.exit(main())
