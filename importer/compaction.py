"""Compaction: rewrite a closed partition's many small files into a few large ones, swapped in atomically.

Every group commit adds one file per partition it touches, so a quiet stream's day is
thousands of small files. A partition is *closed* once its day ended `older_than` ago.
Compacting one (`compact_partition`):
1. its current files (in the partition dir, or in `_compacted-<k>/` if compacted before) are read by
   Spark and written again into `<partition dir>/_compacted-<gen>/`, zstd with dictionaries, as
   ceil(bytes / target) files; the row counts in the Parquet footers must match;
2. under the importer root's lock (importer/partition_files.py), files the importer added
   meanwhile are hard-linked in too, `_compaction.json` is written in state "swapping",
   the catalog's location of the partition is set to `_compacted-<gen>/` (the atomic swap: one
   metastore update), and the marker is set to "done" with the replaced files listed;
3. the replaced files are deleted after `grace` seconds, so a query planned before the
   swap can still read them.
A compaction killed at any point leaves the table correct: before the swap readers see
the old files; a marker left "swapping" is settled by `recover` from the catalog (done
if the location moved, rolled back otherwise), which runs first on every partition the
next compaction or importer start looks at. `_compacted-<n>/` dirs that no marker names are the
remains of a killed run and are deleted.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow.parquet as pq

from importer.catalog import partition_clause
from importer.partition_files import (
    COMPACTED_PREFIX,
    Marker,
    data_files,
    importer_roots,
    partition_dirs,
    read_marker,
    relocate_strays,
    remove_tree,
    root_lock,
    strays,
    write_marker,
)
from importer.paths import local_path, unescape_partition_value
from importer.schema import COMPACT_OPTIONS, DATA_COLUMNS, qualified, spark_read_ddl, sql_string

log = logging.getLogger(__name__)

TARGET_BYTES = 128 * 2**20
DEFAULT_GRACE_S = 300.0
COMPACTION_LOCK = "_compaction_lock"


class CompactionError(RuntimeError):
    """A compaction's output did not match its input; nothing was swapped."""


@dataclass(frozen=True, slots=True)
class PartitionRef:
    """One partition: its catalog values and its directory on the local disk."""

    importer: int
    app_env: str
    date: str
    dir: Path
    root: Path

    @property
    def clause(self) -> str:
        return partition_clause(self.importer, self.app_env, self.date)


@dataclass(frozen=True, slots=True)
class Compacted:
    partition: PartitionRef
    files_before: int
    files_after: int
    rows: int
    bytes_before: int
    bytes_after: int
    seconds: float


def local_partitions(table_location: str) -> Iterator[PartitionRef]:
    table_dir = local_path(table_location)
    if table_dir is None:
        return
    for importer, root in importer_roots(table_dir):
        for escaped, date, pdir in partition_dirs(root):
            yield PartitionRef(importer, unescape_partition_value(escaped), date, pdir, root)


def is_closed(date: str, older_than: float, now: float | None = None) -> bool:
    """Whether the partition's day ended at least `older_than` seconds ago."""
    try:
        day = datetime.date.fromisoformat(date)
    except ValueError:
        return False
    end = datetime.datetime.combine(day + datetime.timedelta(days=1), datetime.time(), datetime.timezone.utc)
    return end.timestamp() <= (time.time() if now is None else now) - older_than


@contextlib.contextmanager
def compaction_lock(table_dir: Path) -> Iterator[bool]:
    """One compaction per table at a time (logjam-spark's schedule and `logjam-sql --compact`); yields False if busy."""
    fd = os.open(table_dir / COMPACTION_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def partition_location(spark: Any, database: str, part: PartitionRef) -> Path | None:
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {qualified(database)} {part.clause}").collect()
    for row in rows:
        if row[0] == "Location":
            return local_path(str(row[1]))
    return None


def set_location(spark: Any, database: str, part: PartitionRef, directory: Path) -> None:
    spark.sql(f"ALTER TABLE {qualified(database)} {part.clause} SET LOCATION '{sql_string(f'file://{directory}')}'")


def settle_locked(spark: Any, database: str, part: PartitionRef, grace: float = DEFAULT_GRACE_S) -> int:
    """With the root lock held: settle a "swapping" marker, then move strays in. Returns files moved."""
    marker = read_marker(part.dir)
    if marker is not None and marker.state == "swapping":
        _settle_swap(spark, database, part, marker, grace)
    return relocate_strays(part.dir)


def recover(spark: Any, database: str, part: PartitionRef, grace: float = DEFAULT_GRACE_S) -> None:
    """Settle what a killed compaction left in one partition: a "swapping" marker, unnamed `_compacted-<n>/` dirs."""
    marker = read_marker(part.dir)
    if marker is not None and marker.state == "swapping":
        with root_lock(part.root):
            settle_locked(spark, database, part, grace)
    marker = read_marker(part.dir)
    keep = {marker.location, *marker.retire_dirs} if marker else set()
    for sub in part.dir.glob(f"{COMPACTED_PREFIX}*"):
        if sub.is_dir() and sub.name not in keep:
            log.info("removing %s, left by a compaction that did not finish", sub)
            remove_tree(sub)


def _settle_swap(spark: Any, database: str, part: PartitionRef, marker: Marker, grace: float) -> None:
    location = partition_location(spark, database, part)
    if location is not None and location.resolve() == (part.dir / marker.location).resolve():
        marker.state, marker.previous, marker.retire_at = "done", None, time.time() + grace
        write_marker(part.dir, marker)
        log.info("finished the swap of %s to %s, which a killed compaction had made", part.dir, marker.location)
    else:
        write_marker(part.dir, Marker(**marker.previous) if marker.previous else None)
        log.info("rolled back a compaction of %s that was killed before its swap", part.dir)


def _rows(files: list[Path]) -> int:
    return sum(pq.read_metadata(p).num_rows for p in files)


def compact_partition(spark: Any, database: str, part: PartitionRef, *, target_bytes: int = TARGET_BYTES,
                      grace: float = DEFAULT_GRACE_S) -> Compacted | None:
    """Compact one partition unless it already has as few files as its size needs. Returns what was done."""
    started = time.monotonic()
    recover(spark, database, part, grace)
    with root_lock(part.root):
        relocate_strays(part.dir)
    marker = read_marker(part.dir)
    current = part.dir / marker.location if marker else part.dir
    sources = data_files(current)
    size = sum(p.stat().st_size for p in sources)
    want = max(1, math.ceil(size / target_bytes))
    if len(sources) <= want:
        return None
    gen = max([marker.gen if marker else 0, *_generations(part.dir)]) + 1
    out = part.dir / f"{COMPACTED_PREFIX}{gen}"
    rows = _rows(sources)
    df = spark.read.schema(spark_read_ddl(data_only=True)).parquet(*[f"file://{p}" for p in sources])
    df.select(*DATA_COLUMNS).coalesce(want).write.options(**COMPACT_OPTIONS).mode("overwrite").parquet(f"file://{out}")
    written = data_files(out)
    if _rows(written) != rows:
        remove_tree(out)
        raise CompactionError(f"compacting {part.dir}: {rows} rows in, {_rows(written)} out; nothing swapped")
    with root_lock(part.root):
        _swap(spark, database, part, marker, out, {p.name for p in sources}, gen, grace)
    return Compacted(part, len(sources), len(written), rows, size, sum(p.stat().st_size for p in written),
                     time.monotonic() - started)


def _generations(pdir: Path) -> list[int]:
    out = []
    for sub in pdir.glob(f"{COMPACTED_PREFIX}*"):
        with contextlib.suppress(ValueError):
            out.append(int(sub.name[len(COMPACTED_PREFIX):]))
    return out


def _swap(spark: Any, database: str, part: PartitionRef, marker: Marker | None, out: Path, sources: set[str],
          gen: int, grace: float) -> None:
    """The locked step: take in late files, mark, move the catalog's location, mark done."""
    current = part.dir / marker.location if marker else part.dir
    late = [p for p in data_files(current) if p.name not in sources]
    if marker is not None:
        late += strays(part.dir, marker)
    for path in late:
        os.link(path, out / path.name)  # a link, not a move: the old location keeps showing it until the swap
    swapping = Marker(gen=gen, state="swapping", retire=[p.name for p in data_files(part.dir)],
                      retire_dirs=([marker.location, *marker.retire_dirs] if marker else []),
                      previous=dict(marker.__dict__) if marker else None)
    write_marker(part.dir, swapping)
    set_location(spark, database, part, out)
    swapping.state, swapping.previous, swapping.retire_at = "done", None, time.time() + grace
    write_marker(part.dir, swapping)


def settle_root(spark: Any, database: str, importer: int, table_location: str) -> int:
    """At an importer's start: settle killed compactions and move strays of its own root. Returns files moved."""
    moved = 0
    for part in local_partitions(table_location):
        if part.importer != importer or not (part.dir / "_compaction.json").exists():
            continue
        recover(spark, database, part)
        with root_lock(part.root):
            moved += settle_locked(spark, database, part)
    return moved


def adopt_compacted(spark: Any, database: str, table_location: str) -> int:
    """After partitions were recovered from the directory tree (a new metastore), point compacted ones at `_compacted-<gen>/`."""
    adopted = 0
    for part in local_partitions(table_location):
        marker = read_marker(part.dir)
        if marker is None:
            continue
        if marker.state == "swapping":
            # The old metastore's answer is gone: the compacted copy holds every row the old files held.
            marker.state, marker.previous = "done", None
            write_marker(part.dir, marker)
        set_location(spark, database, part, part.dir / marker.location)
        with root_lock(part.root):
            relocate_strays(part.dir)
        adopted += 1
    return adopted
