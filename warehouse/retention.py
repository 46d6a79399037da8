"""Retention: drop the partitions of days older than N days from the catalog, then from the disk.

A partition's day is its `date` (the day of `created_at`, UTC). With `--retention-days 7`
the partitions of the 7 days before today (and today) stay; older ones are dropped from
the metastore first, so a query stops seeing them at once, and then their directories are
deleted under the importer root's lock. The device journal's retention
(`--journal-retention-bytes`) is separate: it bounds replay, this bounds the table.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from table.compaction_protocol import PartitionRef, local_partitions
from table.partition_files import live_files, remove_tree, root_lock
from table.schema import qualified

log = logging.getLogger(__name__)

_PER_STATEMENT = 100


@dataclass
class Expired:
    partitions: list[PartitionRef] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0


def cutoff(days: int, today: datetime.date | None = None) -> str:
    """The oldest date kept: partitions with an earlier date are dropped."""
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    return (today - datetime.timedelta(days=days)).isoformat()


def expire(spark: Any, database: str, table_location: str, days: int, today: datetime.date | None = None) -> Expired:
    """Drop every partition older than `days` days; returns what went (rows counted from Parquet footers)."""
    keep_from = cutoff(days, today)
    old = [p for p in local_partitions(table_location) if p.date < keep_from]
    result = Expired()
    for i in range(0, len(old), _PER_STATEMENT):
        chunk = old[i : i + _PER_STATEMENT]
        spark.sql(f"ALTER TABLE {qualified(database)} DROP IF EXISTS " + ", ".join(p.clause for p in chunk))
        for part in chunk:
            rows = 0
            for path in live_files(part.dir):
                try:
                    rows += pq.read_metadata(path).num_rows
                except (OSError, ValueError):  # a torn or foreign file: count nothing for it
                    continue
            with root_lock(part.root):
                freed = remove_tree(part.dir)
            result.partitions.append(part)
            result.rows += rows
            result.bytes += freed
    if result.partitions:
        days_gone = sorted({p.date for p in result.partitions})
        log.info("retention: dropped %d partitions older than %s (%d rows, %.1f MiB), dates %s..%s",
                 len(result.partitions), keep_from, result.rows, result.bytes / 2**20, days_gone[0], days_gone[-1])
    return result
