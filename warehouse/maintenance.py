"""Table maintenance in `logjam-spark`: compaction and retention on a schedule, and the table's metrics.

Every `--compact-interval` seconds (unless `--no-compact`): a compaction pass over every
partition, today's included (warehouse/compaction.py, warehouse/tiers.py), then deletion of
files that compaction replaced more than `--compact-grace` seconds ago. Every
`--maintenance-interval` seconds, retention (with `--retention-days`) first. In between, a
census of the table's partitions, files and bytes for `--metrics-port`. `logjam-sql
--compact` runs one pass. Both need the table on a disk this process can see (a `file:`
warehouse); for a table elsewhere they log once and do nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from table.catalog import table_location
from table.layout import LOOKUPS, Layout
from table import lookup_index
from table import protocol
from table.protocol import live_files, local_partitions
from warehouse.compaction import (
    SCRATCH,
    compaction_lock,
    is_closed,
    plan,
    swap_all,
    write_merges,
)
from warehouse.config import MaintenanceConfig
from warehouse.tiers import FANIN, MAX_LEVEL, TierPolicy, level_of
from table.partition_files import remove_tree
from table.paths import local_path
from warehouse.retention import expire
from table.session import first_line

log = logging.getLogger(__name__)

CENSUS_EVERY = 15.0  # seconds between counts of the table's partitions and files for the metrics
DEFAULTS = MaintenanceConfig()


def add_maintenance_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `MaintenanceConfig` (warehouse/config.py), with its defaults."""
    d = DEFAULTS
    p.add_argument("--retention-days", type=int, default=d.retention_days, metavar="N",
                   help="drop partitions whose date is more than N days before today (default 0: keep everything)")
    p.add_argument("--no-compact", dest="compact", action="store_false", help="do not compact on a schedule")
    p.add_argument("--compact-interval", type=float, default=d.compact_interval, metavar="SECONDS",
                   help="seconds between compaction passes, which keep today's partitions few-filed too "
                        f"(default {d.compact_interval:g})")
    p.add_argument("--compact-fanin", type=int, default=d.compact_fanin, metavar="N",
                   help=f"while a day is open, merge N files of one level into one of the next (default {FANIN})")
    p.add_argument("--compact-max-level", type=int, default=d.compact_max_level, metavar="N",
                   help=f"while a day is open, rewrite a row at most N times (default {MAX_LEVEL})")
    p.add_argument("--compact-throughput", type=float, default=d.compact_throughput, metavar="MIB_PER_S",
                   help="bytes compaction may rewrite a second, on average, so that it never takes the cores "
                        "the importers need (default 2 MiB/s; 0: no limit)")
    p.add_argument("--compact-older-than", type=float, default=d.compact_older_than, metavar="SECONDS",
                   help="a day is closed this long after it ended: its small files are merged into "
                        "--compact-target-bytes files once (default 3600)")
    p.add_argument("--compact-target-bytes", type=int, default=d.compact_target_bytes, metavar="BYTES",
                   help="size of a compacted file (default 128 MiB); files of 3/4 of it are never rewritten")
    p.add_argument("--compact-grace", type=float, default=d.compact_grace, metavar="SECONDS",
                   help="keep replaced files this long for queries planned before the swap (default 300)")
    p.add_argument("--maintenance-interval", type=float, default=d.maintenance_interval, metavar="SECONDS",
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
        self.bytes_read = Counter("logjam_compaction_bytes_read",
                                  "Bytes of files merged by compaction, by who wrote them (importer, compaction)",
                                  ["writer"], registry=r)
        self.bytes_written = Counter("logjam_compaction_bytes_written", "Bytes of files compaction wrote", registry=r)
        self.importer_bytes = Gauge("logjam_table_importer_bytes",
                                    "Bytes of files importers wrote that compaction has not merged yet", registry=r)
        self.lock_hold = Histogram("logjam_compaction_lock_hold_seconds",
                                   "How long compaction held an importer root's lock (an importer's write waits "
                                   "at most this long)", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5), registry=r)
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
        parts = files = size = biggest = fresh = 0
        per_files, per_bytes = [], []
        for part in local_partitions(location):
            live = live_files(part.dir)
            n, b = len(live), sum(_size(p) for p in live)
            fresh += sum(_size(p) for p in live if level_of(p.name) == 0)
            parts, files, size, biggest = parts + 1, files + n, size + b, max(biggest, n)
            per_files.append(n)
            per_bytes.append(b)
        self.partitions.set(parts)
        self.files.set(files)
        self.bytes.set(size)
        self.max_files.set(biggest)
        self.importer_bytes.set(fresh)
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
    index: lookup_index.Refreshed | None = None  # the lookup index's refresh, when it ran


def maintenance_pass(spark: Any, database: str, config: MaintenanceConfig, metrics: TableMetrics | None = None,
                     *, compact: bool = True, older_than: float | None = None, retention: bool = True,
                     throttle: Throttle | None = None, layout: Layout = LOOKUPS) -> PassResult:
    """One pass of retention, compaction and cleanup over the table, merges laid out by `layout`. Returns counts."""
    location = table_location(spark, database)
    table_dir = local_path(location)
    result = PassResult()
    if table_dir is None:
        log.warning("the table is at %s, not on a local disk: no compaction or retention here", location)
        return result
    # Each step is tried on its own: a failed retention or merge must not postpone the deletions that free disk.
    if config.retention_days and retention:
        try:
            gone = expire(spark, database, location, config.retention_days)
        except Exception as e:  # noqa: BLE001 (Spark restarting, a query error: the next pass tries again)
            log.error("retention failed: %s", first_line(e))
        else:
            result.dropped, result.rows_dropped, result.freed = len(gone.partitions), gone.rows, gone.bytes
            if metrics:
                metrics.retention_partitions.inc(len(gone.partitions))
                metrics.retention_rows.inc(gone.rows)
                metrics.retention_bytes.inc(gone.bytes)
    older_than = config.compact_older_than if older_than is None else older_than
    if compact:
        try:
            _compact_all(spark, database, config, location, table_dir, result, metrics, older_than, throttle, layout)
        except Exception as e:  # noqa: BLE001 (a merge job's failure: its output is reaped by the next pass)
            log.error("compaction pass failed: %s", first_line(e))
            result.failed += 1
    with compaction_lock(table_dir) as mine:
        for part in local_partitions(location) if mine else ():
            try:
                result.freed += protocol.delete_retired(spark, database, part)
            except Exception as e:  # noqa: BLE001 (one partition's failure must not stop the others' cleanup)
                _failed(result, part.dir, e)
    if layout.for_lookups:
        result.index = _refresh_index(table_dir)
    if metrics:
        try:
            metrics.census(location)
        except Exception as e:  # noqa: BLE001 (a partition removed mid-walk, a torn file: the next census counts)
            log.warning("table census failed: %s", first_line(e))
    return result


def _refresh_index(table_dir: Any) -> lookup_index.Refreshed | None:
    """The lookup index of every day (table/lookup_index.py), after the pass's merges: a day whose live files
    changed gets its file rewritten, only its new files hashed. Under the compaction lock: one writer of a
    day's file."""
    with compaction_lock(table_dir) as mine:
        if not mine:
            return None
        try:
            done = lookup_index.refresh(table_dir)
        except Exception as e:  # noqa: BLE001 (an index not refreshed only leaves its days searched whole)
            log.warning("lookup index refresh failed: %s", first_line(e))
            return None
    if done.days:
        log.info("lookup index: %d days rewritten (%d files' filters built, %d kept), %.1f KiB, in %.1fs",
                 done.days, done.built, done.reused, done.bytes / 1024, done.seconds)
    return done


class Throttle:
    """Compaction's share of the machine: at most `rate` bytes of input a second, on average.

    Rewriting files takes the same cores the importers' writes need; at a high ingest rate
    an unbounded compaction would slow what it compacts. Like Cassandra's
    compaction_throughput, merges are admitted while the allowance is positive, smallest
    first (the most files gone per byte rewritten); a merge may overdraw it, and the debt is
    paid before the next. Files that wait are merged when the load lets up.
    """

    def __init__(self, rate: float, burst: float = 64 * 2**20) -> None:
        self.rate, self.burst = rate, burst
        self.allowance = burst
        self._at = time.monotonic()

    def admit(self, merges: list[Any]) -> list[Any]:
        now = time.monotonic()
        self.allowance = min(self.burst, self.allowance + (now - self._at) * self.rate)
        self._at = now
        admitted = []
        for merge in sorted(merges, key=lambda m: m.pick.bytes):
            if self.allowance <= 0:
                break
            admitted.append(merge)
            self.allowance -= merge.pick.bytes
        return admitted


def _compact_all(spark: Any, database: str, config: MaintenanceConfig, location: str, table_dir: Any,
                 result: PassResult, metrics: TableMetrics | None, older_than: float,
                 throttle: Throttle | None, layout: Layout) -> None:
    started = time.monotonic()
    policy = TierPolicy(target_bytes=config.compact_target_bytes, fanin=config.compact_fanin,
                        max_level=config.compact_max_level)
    with compaction_lock(table_dir) as mine:
        if not mine:
            log.info("another compaction of %s is running; skipping this pass", location)
            return
        remove_tree(table_dir / SCRATCH)  # what a killed pass left
        merges = []
        for part in list(local_partitions(location)):
            try:
                merge = plan(spark, database, part, policy, closed=is_closed(part.date, older_than),
                             grace=config.compact_grace)
            except Exception as e:  # noqa: BLE001 (one partition's failure must not stop the pass)
                _failed(result, part.dir, e)
                continue
            if merge is not None:
                merges.append(merge)
        merges = throttle.admit(merges) if throttle is not None else merges
        planned = time.monotonic()
        by_spark = write_merges(spark, merges, table_dir / SCRATCH, layout) if merges else 0
        written = time.monotonic()
        held = metrics.lock_hold.observe if metrics is not None else (lambda seconds: None)
        for merge, done in swap_all(spark, database, merges, config.compact_grace, held):
            if isinstance(done, BaseException):
                _failed(result, merge.part.dir, done)
                continue
            result.compacted += 1
            _count(metrics, merge, done)
            log.log(logging.INFO if merge.pick.level > policy.max_level else logging.DEBUG,
                    "compacted importer=%d app_env=%s date=%s: %d files -> %d (level %d), %d rows, "
                    "%.2f -> %.2f MiB", merge.part.importer, merge.part.app_env, merge.part.date,
                    done.files_before, done.files_after, merge.pick.level, done.rows,
                    done.bytes_before / 2**20, done.bytes_after / 2**20)
        if merges:
            log.info("compaction pass: %d merges (%d by Spark, %d failed) in %.1fs (plan %.1fs, writes %.1fs, "
                     "swaps %.1fs)", result.compacted, by_spark, result.failed, time.monotonic() - started,
                     planned - started, written - planned, time.monotonic() - written)
    if metrics:
        metrics.compaction_runs.inc()
        metrics.compacted.inc(result.compacted)
        metrics.compaction_failures.inc(result.failed)
        metrics.compaction_seconds.observe(time.monotonic() - started)


def _failed(result: PassResult, where: Any, e: BaseException) -> None:
    result.failed += 1
    log.error("compacting %s failed: %s", where, first_line(e))


def _count(metrics: TableMetrics | None, merge: Any, done: Any) -> None:
    """Bytes in and out, the importers' own files apart: write amplification is out over what they wrote."""
    if metrics is None:
        return
    for path in merge.sources:
        with contextlib.suppress(FileNotFoundError):
            kind = "importer" if level_of(path.name) == 0 else "compaction"
            metrics.bytes_read.labels(kind).inc(path.stat().st_size)
    metrics.bytes_written.inc(done.bytes_after)  # the merged files only, not the links to the files kept


def run_maintenance(spark: Any, database: str, config: MaintenanceConfig, stopping: threading.Event,
                    metrics: TableMetrics | None = None) -> None:
    """Compaction passes every --compact-interval seconds, retention every --maintenance-interval, until stopping."""
    location = None
    next_retention = 0.0
    rate = config.compact_throughput
    throttle = Throttle(rate * 2**20) if rate > 0 else None
    interval = config.compact_interval if config.compact else config.maintenance_interval
    while not stopping.is_set():
        now = time.monotonic()
        next_pass = now + interval
        retention = now >= next_retention
        if retention:
            next_retention = now + config.maintenance_interval
        try:
            maintenance_pass(spark, database, config, metrics, compact=config.compact, retention=retention,
                             throttle=throttle)
            location = table_location(spark, database)
        except Exception as e:  # a failed pass (Spark restarting, a query error) must not end the schedule
            log.warning("maintenance pass failed: %s", first_line(e))
        # The census is a walk of the table's directories: cheap enough to keep the metrics fresh.
        while not stopping.wait(min(CENSUS_EVERY, max(0.0, next_pass - time.monotonic()))):
            if time.monotonic() >= next_pass:
                break
            if metrics is not None and location is not None:
                try:
                    metrics.census(location)
                except Exception as e:  # noqa: BLE001 (a walk that met a partition being removed: the next one counts)
                    log.warning("table census failed: %s", first_line(e))
