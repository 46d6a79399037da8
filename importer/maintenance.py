"""Table maintenance in `logjam-spark`: compaction and retention on a schedule, and the table's metrics.

Every `--maintenance-interval` seconds: retention (with `--retention-days`), then
compaction of closed partitions (unless `--no-compact`), then deletion of files that
compaction replaced more than `--compact-grace` seconds ago, then a census of the table's
partitions, files and bytes for `--metrics-port`. `logjam-sql --compact` runs the same
pass once. Both need the table on a disk this process can see (a `file:` warehouse);
for a table elsewhere they log once and do nothing.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from importer.catalog import table_location
from importer.compaction import (
    DEFAULT_GRACE_S,
    TARGET_BYTES,
    CompactionError,
    compact_partition,
    compaction_lock,
    is_closed,
    local_partitions,
)
from importer.partition_files import delete_retired, live_files
from importer.paths import local_path
from importer.retention import expire
from importer.session import first_line

log = logging.getLogger(__name__)

CENSUS_EVERY = 15.0  # seconds between counts of the table's partitions and files for the metrics


def add_maintenance_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--retention-days", type=int, default=0, metavar="N",
                   help="drop partitions whose date is more than N days before today (default 0: keep everything)")
    p.add_argument("--no-compact", dest="compact", action="store_false", help="do not compact on a schedule")
    p.add_argument("--compact-older-than", type=float, default=3600.0, metavar="SECONDS",
                   help="compact a partition once its day ended this long ago (default 3600)")
    p.add_argument("--compact-target-bytes", type=int, default=TARGET_BYTES, metavar="BYTES",
                   help="size of a compacted file (default 128 MiB); smaller partitions become one file")
    p.add_argument("--compact-grace", type=float, default=DEFAULT_GRACE_S, metavar="SECONDS",
                   help="keep replaced files this long for queries planned before the swap (default 300)")
    p.add_argument("--maintenance-interval", type=float, default=600.0, metavar="SECONDS",
                   help="seconds between maintenance passes (default 600)")


class TableMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.partitions = Gauge("logjam_table_partitions", "Partitions of the messages table on disk", registry=r)
        self.files = Gauge("logjam_table_files", "Data files a query of the whole table reads", registry=r)
        self.bytes = Gauge("logjam_table_bytes", "Bytes of those files", registry=r)
        self.max_files = Gauge("logjam_table_partition_files_max", "Files of the partition with the most files",
                               registry=r)
        self.files_per_partition = Histogram(
            "logjam_table_partition_files", "Files per partition (at the last census)",
            buckets=(1, 2, 4, 16, 64, 256, 1024, 4096), registry=r)
        self.bytes_per_partition = Histogram(
            "logjam_table_partition_bytes", "Bytes per partition (at the last census)",
            buckets=(2**20, 2**24, 2**27, 2**30, 2**33), registry=r)
        self.compaction_runs = Counter("logjam_compaction_runs", "Maintenance passes that compacted", registry=r)
        self.compacted = Counter("logjam_compaction_partitions", "Partitions compacted", registry=r)
        self.compaction_failures = Counter("logjam_compaction_failures", "Partitions whose compaction failed",
                                           registry=r)
        self.compaction_seconds = Histogram("logjam_compaction_seconds", "Seconds per compaction pass",
                                            buckets=(1, 5, 15, 60, 300, 1800), registry=r)
        self.retention_partitions = Counter("logjam_retention_partitions_dropped", "Partitions dropped by retention",
                                            registry=r)
        self.retention_rows = Counter("logjam_retention_rows_dropped", "Rows dropped by retention", registry=r)
        self.retention_bytes = Counter("logjam_retention_bytes_dropped", "Bytes deleted by retention", registry=r)

    def census(self, location: str) -> None:
        """Reset the per-partition histograms and gauges from the table's files now."""
        parts = files = size = biggest = 0
        per_files, per_bytes = [], []
        for part in local_partitions(location):
            live = live_files(part.dir)
            n, b = len(live), sum(_size(p) for p in live)
            parts, files, size, biggest = parts + 1, files + n, size + b, max(biggest, n)
            per_files.append(n)
            per_bytes.append(b)
        self.partitions.set(parts)
        self.files.set(files)
        self.bytes.set(size)
        self.max_files.set(biggest)
        _refill(self.files_per_partition, per_files)
        _refill(self.bytes_per_partition, per_bytes)


def _size(path: Any) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _refill(histogram: Histogram, values: list[int]) -> None:
    """A census histogram describes the table now, not since start: start it over each time."""
    histogram._metric_init()  # noqa: SLF001 (prometheus_client has no public reset)
    for v in values:
        histogram.observe(v)


@dataclass
class PassResult:
    compacted: int = 0
    failed: int = 0
    dropped: int = 0
    rows_dropped: int = 0
    freed: int = 0


def maintenance_pass(spark: Any, database: str, args: argparse.Namespace, metrics: TableMetrics | None = None,
                     *, compact: bool = True, older_than: float | None = None) -> PassResult:
    """One pass of retention, compaction and cleanup over the table. Returns counts."""
    location = table_location(spark, database)
    table_dir = local_path(location)
    result = PassResult()
    if table_dir is None:
        log.warning("the table is at %s, not on a local disk: no compaction or retention here", location)
        return result
    if args.retention_days:
        gone = expire(spark, database, location, args.retention_days)
        result.dropped, result.rows_dropped, result.freed = len(gone.partitions), gone.rows, gone.bytes
        if metrics:
            metrics.retention_partitions.inc(len(gone.partitions))
            metrics.retention_rows.inc(gone.rows)
            metrics.retention_bytes.inc(gone.bytes)
    if compact:
        _compact_all(spark, database, args, location, table_dir, result, metrics,
                     args.compact_older_than if older_than is None else older_than)
    for part in local_partitions(location):
        result.freed += delete_retired(part.dir)
    if metrics:
        metrics.census(location)
    return result


def _compact_all(spark: Any, database: str, args: argparse.Namespace, location: str, table_dir: Any,
                 result: PassResult, metrics: TableMetrics | None, older_than: float) -> None:
    started = time.monotonic()
    with compaction_lock(table_dir) as mine:
        if not mine:
            log.info("another compaction of %s is running; skipping this pass", location)
            return
        for part in list(local_partitions(location)):
            if not is_closed(part.date, older_than):
                continue
            try:
                done = compact_partition(spark, database, part, target_bytes=args.compact_target_bytes,
                                         grace=args.compact_grace)
            except (CompactionError, OSError) as e:
                result.failed += 1
                log.error("compacting %s failed: %s", part.dir, first_line(e))
                continue
            if done is not None:
                result.compacted += 1
                log.info("compacted importer=%d app_env=%s date=%s: %d files -> %d, %d rows, %.1f -> %.1f MiB in %.1fs",
                         part.importer, part.app_env, part.date, done.files_before, done.files_after, done.rows,
                         done.bytes_before / 2**20, done.bytes_after / 2**20, done.seconds)
    if metrics:
        metrics.compaction_runs.inc()
        metrics.compacted.inc(result.compacted)
        metrics.compaction_failures.inc(result.failed)
        metrics.compaction_seconds.observe(time.monotonic() - started)


def run_maintenance(spark: Any, args: argparse.Namespace, stopping: threading.Event,
                    metrics: TableMetrics | None = None) -> None:
    """Maintenance passes every --maintenance-interval seconds until `stopping` is set; a census in between."""
    location = None
    while not stopping.is_set():
        next_pass = time.monotonic() + args.maintenance_interval
        try:
            maintenance_pass(spark, args.database, args, metrics, compact=args.compact)
            location = table_location(spark, args.database)
        except Exception as e:  # a failed pass (Spark restarting, a query error) must not end the schedule
            log.warning("maintenance pass failed: %s", first_line(e))
        # The census is a walk of the table's directories: cheap enough to keep the metrics fresh.
        while not stopping.wait(min(CENSUS_EVERY, max(0.0, next_pass - time.monotonic()))):
            if time.monotonic() >= next_pass:
                break
            if metrics is not None and location is not None:
                metrics.census(location)
