"""Retention: drop the partitions of days older than N days from the catalog, then from the disk.

A partition's day is its `date` (the day of `created_at`, UTC, when that lies within the
importer's window; table/event_time.py). With `--retention-days 7` the partitions of the 7
days before today (and today) stay; an older one goes only once every row in it arrived
(`ingested_at`) before those days too, so no row is dropped sooner than the retention after it
arrived: a partition that took late events stays until the retention has passed for the
newest of them (at most twice the retention, as the importer files an event older than the
retention under the day it arrived). What goes is decided again under the importer root's
lock, marked dropping, dropped from the metastore (a query stops seeing it at once), and then
its directory is deleted (table/protocol.py `drop`): an importer that registered the partition
before finds its directory gone under the same lock and registers it anew, so no row lands in
a directory the catalog no longer knows.
The device journal's retention (`--journal-retention-bytes`) is separate: it bounds replay,
this bounds the table.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from table import protocol
from table.partition_files import importer_roots
from table.paths import local_path
from table.protocol import PartitionRef, live_files, local_partitions

log = logging.getLogger(__name__)

_PER_STATEMENT = 100


@dataclass
class Expired:
    partitions: list[PartitionRef] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    held: list[PartitionRef] = field(default_factory=list)  # old days kept for rows that arrived since


def cutoff(days: int, today: datetime.date | None = None) -> str:
    """The oldest date kept: partitions with an earlier date are dropped."""
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    return (today - datetime.timedelta(days=days)).isoformat()


def expire(spark: Any, database: str, table_location: str, days: int, today: datetime.date | None = None) -> Expired:
    """Drop every partition older than `days` days; returns what went (rows counted from Parquet footers)."""
    keep_from = cutoff(days, today)
    result = Expired()
    by_root: dict[Any, list[PartitionRef]] = {}
    for part in local_partitions(table_location):
        if part.date < keep_from:
            (by_root.setdefault(part.root, []) if _expired(part, keep_from) else result.held).append(part)
    counted: dict[PartitionRef, int] = {}

    def still_expired(part: PartitionRef) -> bool:  # under the root's lock: nothing lands meanwhile
        counted[part] = _rows(live_files(part.dir))
        return _expired(part, keep_from)

    for parts in by_root.values():
        for i in range(0, len(parts), _PER_STATEMENT):
            for part in protocol.drop(spark, database, parts[i : i + _PER_STATEMENT], still_expired):
                result.partitions.append(part)
                result.rows += counted.get(part, 0)
    table_dir = local_path(table_location)
    for _, root in importer_roots(table_dir) if table_dir is not None else ():
        result.bytes += protocol.reap_dropped(root)  # this pass's drops, and what killed ones left
    if result.partitions:
        days_gone = sorted({p.date for p in result.partitions})
        log.info("retention: dropped %d partitions older than %s (%d rows, %.1f MiB), dates %s..%s",
                 len(result.partitions), keep_from, result.rows, result.bytes / 2**20, days_gone[0], days_gone[-1])
    if result.held:
        log.info("retention: kept %d partitions older than %s whose rows arrived since (late events), dates %s..%s",
                 len(result.held), keep_from, min(p.date for p in result.held), max(p.date for p in result.held))
    return result


def _expired(part: PartitionRef, keep_from: str) -> bool:
    newest = newest_arrival(live_files(part.dir))
    return newest is None or newest.isoformat() < keep_from


def _rows(files: list[Path]) -> int:
    rows = 0
    for path in files:
        try:
            rows += pq.read_metadata(path).num_rows
        except (OSError, ValueError):  # a torn or foreign file: count nothing for it
            continue
    return rows


def newest_arrival(files: list[Path]) -> datetime.date | None:
    """The UTC day of the latest `ingested_at` in these Parquet files; None when they hold no rows.

    Read from the footers' statistics where the files have them, else from the column (Spark
    writes timestamps as INT96 by default, with no statistics). For a file that cannot be read
    (torn, or not this table's) its modification time stands in: no row in it arrived later.
    """
    newest: int | None = None
    for path in files:
        try:
            latest = _latest_us(path)
        except (OSError, ValueError, pa.ArrowException):
            latest = _modified_us(path)
        if latest is not None and (newest is None or latest > newest):
            newest = latest
    return None if newest is None else datetime.date(1970, 1, 1) + datetime.timedelta(microseconds=newest)


def _latest_us(path: Path) -> int | None:
    meta = pq.read_metadata(path)
    if meta.num_rows == 0:
        return None
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if "ingested_at" not in names:
        return _modified_us(path)
    column = names.index("ingested_at")
    stats = [meta.row_group(g).column(column).statistics for g in range(meta.num_row_groups)]
    if all(s is not None and s.has_min_max and isinstance(s.max, datetime.datetime) for s in stats):
        return max(_micros(s.max) for s in stats)  # type: ignore[union-attr]
    values = pq.read_table(path, columns=["ingested_at"], coerce_int96_timestamp_unit="us").column(0)
    latest = pc.max(values.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())).as_py()
    return None if latest is None else int(latest)


def _micros(ts: datetime.datetime) -> int:
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=datetime.timezone.utc)
    return (ts - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)) // datetime.timedelta(microseconds=1)


def _modified_us(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns // 1000
    except OSError:  # gone meanwhile (a compaction's cleanup): nothing of it to keep
        return None
