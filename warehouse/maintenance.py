"""Maintenance of the `messages` Delta table in `logjam-spark`: one actor, with delta-rs alone.

Every `--compact-interval` seconds (unless `--no-compact`) a pass compacts the partitions whose
small files are due (today's too) and writes a checkpoint every `--checkpoint-every` commits.
Every `--maintenance-interval` seconds the pass also deletes the days older than
`--retention-days` (whole partitions, a predicate on `date` alone, so no file is rewritten),
removes log entries older than `--log-retention-hours` and VACUUMs the files removed more than
`--vacuum-grace-hours` ago. After each pass a census sets the table's metrics
(warehouse/table_metrics.py). `logjam-sql --compact` runs one pass by hand.

Importers append at the same time (table/delta.py). Every commit here goes through the log's
conflict check; one that loses (`CommitFailedError`) is logged and tried again by the next
pass. Compaction and VACUUM never make an importer's append fail; retention's DELETE (its
`remove`s change data) and the one-time setting of `delta.logRetentionDuration` (a metadata
commit) refuse an append committed on a snapshot from before them, which the append retries
on a fresh one, its txns keeping it exactly once (tests/test_delta_commit.py).
docs/reliability.md, "How the mesh uses Delta's log", states why no row is lost or doubled.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from table.delta import NO_HOOKS, open_table, writer_properties
from table.session import first_line
from warehouse.config import MaintenanceConfig
from warehouse.delta_log import DeltaLog
from warehouse.table_metrics import TableMetrics

log = logging.getLogger(__name__)

DEFAULTS = MaintenanceConfig()
LOG_RETENTION = "delta.logRetentionDuration"
# A file is small, and counts towards a partition's compaction, below half its tier's target:
# any two such files fit in one output file, so a due compaction always merges some.
SMALL_FRACTION = 0.5
# A closed day is compacted as soon as it has two small files; an open one waits for
# --compact-min-files, so that its merged file is not rewritten for every batch.
CLOSED_MIN_FILES = 2
# Compaction's share of the two cores the importers also need: one DataFusion task at a time.
COMPACT_TASKS = 1
# Rows per file of a merged file: what its bloom filters are sized for (table/delta.py).
MERGED_ROWS = 1_000_000

__all__ = ["MaintenanceConfig", "Maintainer", "PassResult", "TableMetrics", "add_maintenance_flags",
           "maintenance_pass", "run_maintenance"]


def add_maintenance_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `MaintenanceConfig` (warehouse/config.py), with its defaults."""
    d = DEFAULTS
    p.add_argument("--retention-days", type=int, default=d.retention_days, metavar="N",
                   help="delete the days more than N days before today (default 0: keep everything)")
    p.add_argument("--no-compact", dest="compact", action="store_false", help="do not compact on a schedule")
    p.add_argument("--compact-interval", type=float, default=d.compact_interval, metavar="SECONDS",
                   help="seconds between passes of compaction and checkpoints, which keep today's partitions "
                        f"few-filed too (default {d.compact_interval:g})")
    p.add_argument("--compact-min-files", type=int, default=d.compact_min_files, metavar="N",
                   help="compact an open day's partition once it has N small files (default "
                        f"{d.compact_min_files}); a closed day's as soon as it has {CLOSED_MIN_FILES}")
    p.add_argument("--compact-open-target-bytes", type=int, default=d.compact_open_target_bytes, metavar="BYTES",
                   help="size of a file compacted while its day is open (default 16 MiB)")
    p.add_argument("--compact-target-bytes", type=int, default=d.compact_target_bytes, metavar="BYTES",
                   help="size of a file compacted once its day is closed (default 128 MiB)")
    p.add_argument("--compact-older-than", type=float, default=d.compact_older_than, metavar="SECONDS",
                   help=f"a day is closed this long after it ended (default {d.compact_older_than:g})")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, metavar="COMMITS",
                   help=f"write a checkpoint of the log every N commits (default {d.checkpoint_every})")
    p.add_argument("--log-retention-hours", type=int, default=d.log_retention_hours, metavar="HOURS",
                   help="keep the log's history (time travel) this long; older entries before a checkpoint are "
                        f"deleted (default {d.log_retention_hours})")
    p.add_argument("--vacuum-grace-hours", type=int, default=d.vacuum_grace_hours, metavar="HOURS",
                   help="VACUUM deletes a file this long after compaction or retention removed it, and a file no "
                        "commit names this long after it was written: longer than any query or write runs "
                        f"(default {d.vacuum_grace_hours})")
    p.add_argument("--maintenance-interval", type=float, default=d.maintenance_interval, metavar="SECONDS",
                   help="seconds between retention, log cleanup and VACUUM (default 600)")


@dataclass
class PassResult:
    """What one pass did."""

    compacted: int = 0  # partitions compacted
    files_removed: int = 0  # files compaction merged
    files_added: int = 0  # files it wrote
    failed: int = 0  # steps or partitions that failed (tried again next pass)
    conflicts: int = 0  # commits that lost to another writer (tried again next pass)
    checkpoint: int | None = None  # the version checkpointed
    dropped: int = 0  # files retention removed
    rows_dropped: int = 0
    bytes_dropped: int = 0
    cleaned: bool = False  # log cleanup ran
    vacuumed: int = 0  # files VACUUM deleted
    seconds: float = 0.0


@dataclass
class Due:
    """One partition whose compaction is due."""

    app_env: str
    date: dt.date
    target: int
    small: frozenset[str] = field(default_factory=frozenset)  # its small files' paths


class Maintainer:
    """The maintenance actor of one table: its snapshot, kept between passes, and what past passes learnt."""

    def __init__(self, location: str, config: MaintenanceConfig, metrics: TableMetrics | None = None,
                 storage_options: Mapping[str, str] | None = None) -> None:
        self.location, self.config, self.metrics = location, config, metrics
        self.storage_options = dict(storage_options or {})
        self.log = DeltaLog(location, self.storage_options)
        self._table: DeltaTable | None = None
        # Partitions whose last compaction merged nothing, with the small files it saw: not tried
        # again until those change (delta-rs's bins may leave a few small files it will not merge).
        self._futile: dict[tuple[str, dt.date], frozenset[str]] = {}
        self._log_files: int | None = None

    def table(self) -> DeltaTable:
        """The table at its latest version: the snapshot brought up to date, or opened anew."""
        if self._table is None:
            self._table = open_table(self.location, self.storage_options)
        else:
            try:
                self._table.update_incremental()
            except Exception:  # noqa: BLE001 (a log entry cleaned up under it: a fresh snapshot reads the checkpoint)
                self._table = None
                return self.table()
        return self._table

    def reopen(self) -> None:
        """Start from the latest checkpoint next time: a snapshot kept open grows what each commit walks."""
        self._table = None

    def run_pass(self, *, compact: bool = True, slow: bool = True, now: float | None = None) -> PassResult:
        """One pass: with `slow`, retention first; compaction (with `compact`) and the checkpoint; with
        `slow`, log cleanup and VACUUM; then the census. Each step is tried on its own: a failed
        compaction must not postpone the deletions that free disk."""
        started = time.monotonic()
        now = time.time() if now is None else now
        result = PassResult()
        table = self.table()
        if slow and self.config.retention_days:
            self._step(result, "retention", lambda: self._retention(table, result, now))
        if compact:
            self._compact(table, result, now)
        self._step(result, "checkpoint", lambda: self._checkpoint(table, result))
        table = self.table()
        if slow:
            self._step(result, "log cleanup", lambda: self._cleanup(table, result))
            self._step(result, "vacuum", lambda: self._vacuum(table, result))
        result.seconds = time.monotonic() - started
        if self.metrics is not None:
            self._step(result, "census", lambda: self._census(self.table(), slow))
        return result

    def _step(self, result: PassResult, name: str, run: Any) -> None:
        try:
            run()
        except CommitFailedError as e:
            result.conflicts += 1
            if self.metrics is not None:
                self.metrics.conflicts.labels(name).inc()
            log.warning("%s lost a commit to another writer; the next pass tries again: %s", name, first_line(e))
        except Exception as e:  # noqa: BLE001 (a store error, a table being replaced: the next pass tries again)
            result.failed += 1
            log.error("%s failed: %s", name, first_line(e))

    def _retention(self, table: DeltaTable, result: PassResult, now: float) -> None:
        cutoff = dt.datetime.fromtimestamp(now, dt.timezone.utc).date() - dt.timedelta(days=self.config.retention_days)
        files = add_actions(table, arrivals=True)
        old = files.filter(pc.less(files["date"], pa.scalar(cutoff, pa.date32())))
        if old.num_rows == 0:
            return
        # A day goes only once every row in it arrived before the cutoff too, so that a row is kept
        # at least the retention after it arrived, whatever its own time (table/event_time.py).
        cutoff_us = int(dt.datetime.combine(cutoff, dt.time(), dt.timezone.utc).timestamp() * 1e6)
        newest = old.group_by("date").aggregate([("arrived_us", "max")])
        days = sorted(d for d, us in zip(newest["date"].to_pylist(), newest["arrived_us_max"].to_pylist())
                      if us < cutoff_us)
        if not days:
            return
        old = old.filter(pc.is_in(old["date"], pa.array(days, pa.date32())))
        # A predicate on the partition column alone: delta-rs removes whole files, rewriting none.
        listed = ", ".join(f"'{d.isoformat()}'" for d in days)
        done = table.delete(f"date IN ({listed})", post_commithook_properties=NO_HOOKS)
        result.dropped += int(done.get("num_removed_files", 0))
        result.rows_dropped += int(done.get("num_deleted_rows", 0))
        result.bytes_dropped += int(pc.sum(old["size_bytes"]).as_py() or 0)
        parts = len(set(zip(old["app_env"].to_pylist(), old["date"].to_pylist())))
        log.info("retention: deleted %d partitions of %d days before %s (%d files, %d rows)", parts, len(days),
                 cutoff, result.dropped, result.rows_dropped)
        if self.metrics is not None:
            self.metrics.retention_partitions.inc(parts)
            self.metrics.retention_rows.inc(result.rows_dropped)
            self.metrics.retention_bytes.inc(result.bytes_dropped)

    def due(self, table: DeltaTable, now: float) -> list[Due]:
        """The partitions whose compaction is due: an open day's with --compact-min-files small files, a
        closed day's with two; small is below half of the day's target size."""
        c = self.config
        files = add_actions(table)
        closed_before = dt.datetime.fromtimestamp(now - c.compact_older_than, dt.timezone.utc).date()
        closed = pc.less(files["date"], pa.scalar(closed_before, pa.date32()))
        target = pc.if_else(closed, c.compact_target_bytes, c.compact_open_target_bytes)
        small = files.filter(pc.less(files["size_bytes"], pc.multiply(target.cast(pa.float64()), SMALL_FRACTION)))
        small = small.append_column("closed", pc.less(small["date"], pa.scalar(closed_before, pa.date32())))
        counts = small.group_by(["app_env", "date", "closed"]).aggregate([("path", "count")])
        out = []
        for app_env, date, is_closed, n in zip(*(counts[k].to_pylist() for k in
                                                  ("app_env", "date", "closed", "path_count"))):
            if n < (CLOSED_MIN_FILES if is_closed else c.compact_min_files):
                continue
            out.append(Due(app_env, date, c.compact_target_bytes if is_closed else c.compact_open_target_bytes))
        if not out:
            return out
        # Only now the paths, for the few partitions due: what tells a futile retry apart.
        keys = pa.array([f"{d.app_env}\x00{d.date}" for d in out])
        key = pc.binary_join_element_wise(small["app_env"], small["date"].cast(pa.string()), "\x00")
        mine = small.filter(pc.is_in(key, keys))
        paths: dict[tuple[str, dt.date], set[str]] = {}
        for a, d, p in zip(mine["app_env"].to_pylist(), mine["date"].to_pylist(), mine["path"].to_pylist()):
            paths.setdefault((a, d), set()).add(p)
        for d in out:
            d.small = frozenset(paths.get((d.app_env, d.date), ()))
        return [d for d in out if self._futile.get((d.app_env, d.date)) != d.small]

    def _compact(self, table: DeltaTable, result: PassResult, now: float) -> None:
        started = time.monotonic()
        try:
            due = self.due(table, now)
        except Exception as e:  # noqa: BLE001 (an unreadable snapshot: the next pass reads it again)
            result.failed += 1
            log.error("planning compaction failed: %s", first_line(e))
            return
        for part in sorted(due, key=lambda d: -len(d.small)):  # the most files gone first
            self._step(result, "compaction", lambda: self._compact_one(table, part, result))
        if self.metrics is not None and due:
            self.metrics.compaction_runs.inc()
            self.metrics.compaction_seconds.observe(time.monotonic() - started)

    def _compact_one(self, table: DeltaTable, part: Due, result: PassResult) -> None:
        key = (part.app_env, part.date)
        try:
            done = table.optimize.compact(
                partition_filters=[("app_env", "=", part.app_env), ("date", "=", part.date.isoformat())],
                target_size=part.target, max_concurrent_tasks=COMPACT_TASKS,
                writer_properties=writer_properties(MERGED_ROWS, compression="ZSTD"),
                post_commithook_properties=NO_HOOKS)
        except Exception:
            if self.metrics is not None:
                self.metrics.compaction_failures.inc()
            raise
        removed, added = int(done.get("numFilesRemoved", 0)), int(done.get("numFilesAdded", 0))
        if removed < 2:
            self._futile[key] = part.small
            return
        self._futile.pop(key, None)
        result.compacted += 1
        result.files_removed += removed
        result.files_added += added
        log.debug("compacted app_env=%s date=%s: %d files -> %d", part.app_env, part.date, removed, added)
        if self.metrics is not None:
            self.metrics.compacted.inc()
            self.metrics.bytes_read.inc(_total(done.get("filesRemoved")))
            self.metrics.bytes_written.inc(_total(done.get("filesAdded")))

    def _checkpoint(self, table: DeltaTable, result: PassResult) -> None:
        last = self.log.last_checkpoint()
        version = table.version()
        if version - (last.version if last is not None else 0) < self.config.checkpoint_every:
            return
        table.create_checkpoint()
        result.checkpoint = version
        log.info("checkpoint at version %d", version)
        if self.metrics is not None:
            self.metrics.checkpoints.inc()
        self.reopen()

    def _cleanup(self, table: DeltaTable, result: PassResult) -> None:
        # delta-rs's cleanup reads the retention from this table property alone. Setting it is a
        # metadata commit, which makes a concurrent append retry: done only when it differs.
        wanted = f"interval {self.config.log_retention_hours} hours"
        if table.metadata().configuration.get(LOG_RETENTION) != wanted:
            table.alter.set_table_properties({LOG_RETENTION: wanted}, raise_if_not_exists=False,
                                             post_commithook_properties=NO_HOOKS)
            log.info("set %s to %r", LOG_RETENTION, wanted)
        # Deletes only the entries before a checkpoint older than the retention: a reader always
        # finds a checkpoint and every commit after it.
        table.cleanup_metadata()
        result.cleaned = True
        self._log_files = self.log.files()

    def _vacuum(self, table: DeltaTable, result: PassResult) -> None:
        # Full: also the files no commit names (a write or a compaction killed before its commit),
        # once older than the grace, which is longer than any write runs before it commits.
        gone = table.vacuum(retention_hours=self.config.vacuum_grace_hours, enforce_retention_duration=False,
                            dry_run=False, full=True, post_commithook_properties=NO_HOOKS)
        result.vacuumed = len(gone)
        if gone:
            log.info("vacuum deleted %d files", len(gone))
        if self.metrics is not None:
            self.metrics.vacuumed.inc(len(gone))

    def _census(self, table: DeltaTable, slow: bool) -> None:
        assert self.metrics is not None
        files = add_actions(table)
        per = files.group_by(["app_env", "date"]).aggregate([("path", "count"), ("size_bytes", "sum")])
        pairs = list(zip(per["path_count"].to_pylist(), per["size_bytes_sum"].to_pylist()))
        if self._log_files is None or slow:
            self._log_files = self.log.files()
        self.metrics.census(pairs, table.version(), self.log.last_checkpoint(), self._log_files)


def add_actions(table: DeltaTable, *, arrivals: bool = False) -> pa.Table:
    """The snapshot's live files: path, size_bytes, app_env, date; with `arrivals`, also arrived_us, the
    latest `ingested_at` in the file (its statistics; where it has none, when it was written)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    out = {"path": actions["path"], "size_bytes": actions["size_bytes"],
           "app_env": actions["partition.app_env"], "date": actions["partition.date"]}
    if arrivals:
        written_us = pc.multiply(actions["modification_time"].cast(pa.int64()), 1000)  # milliseconds in the log
        stat = (actions["max.ingested_at"].cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
                if "max.ingested_at" in actions.column_names else written_us)
        out["arrived_us"] = pc.coalesce(stat, written_us)
    return pa.table(out)


def _total(metric: Any) -> int:
    """`totalSize` of delta-rs's OPTIMIZE file statistics (a JSON string or a dict)."""
    if isinstance(metric, str):
        metric = json.loads(metric)
    return int((metric or {}).get("totalSize", 0))


def maintenance_pass(location: str, config: MaintenanceConfig, metrics: TableMetrics | None = None, *,
                     compact: bool = True, slow: bool = True, now: float | None = None,
                     storage_options: Mapping[str, str] | None = None) -> PassResult:
    """One whole pass (every step) over the table at `location`, by a maintainer of its own."""
    return Maintainer(location, config, metrics, storage_options).run_pass(compact=compact, slow=slow, now=now)


def run_maintenance(location: str, config: MaintenanceConfig, stopping: threading.Event,
                    metrics: TableMetrics | None = None, storage_options: Mapping[str, str] | None = None) -> None:
    """Passes every --compact-interval seconds (--maintenance-interval with --no-compact), the slow steps
    every --maintenance-interval, until `stopping`."""
    maintainer = Maintainer(location, config, metrics, storage_options)
    interval = config.compact_interval if config.compact else config.maintenance_interval
    next_slow = 0.0
    while not stopping.is_set():
        now = time.monotonic()
        slow = now >= next_slow
        if slow:
            next_slow = now + config.maintenance_interval
        try:
            maintainer.run_pass(compact=config.compact, slow=slow)
        except Exception as e:  # noqa: BLE001 (the table unreadable for now: the schedule goes on)
            maintainer.reopen()
            log.warning("maintenance pass failed: %s", first_line(e))
        stopping.wait(max(0.0, now + interval - time.monotonic()))
