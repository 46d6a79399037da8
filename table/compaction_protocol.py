"""The compaction protocol: the rules by which a partition's files are swapped for a compacted set, which the
table's writers (logjam-importer) and its compactor (logjam-spark, `logjam-sql --compact`) both follow.

Under the importer root's lock (table/partition_files.py), a compaction links every file it did
not merge into `<partition dir>/_compacted-<gen>/`, writes `_compaction.json` in state
"swapping", moves the catalog's location of the partition there (the atomic swap: one
metastore update), and marks it "done" (`swap_in`). A writer, under the same lock, settles a
"swapping" marker a killed compaction left and moves its own new files (strays) into the
current location (`settle_locked`); at its start it does so for its whole root (`settle_root`).
A marker left "swapping" is settled from the catalog: done if the location moved, rolled
back otherwise. Which files to merge, and the merging itself, are warehouse/compaction.py's.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from table.partition_files import (
    COMPACTED_PREFIX,
    Marker,
    data_files,
    importer_roots,
    marker_from_dict,
    partition_dirs,
    read_marker,
    relocate_strays,
    remove_tree,
    root_lock,
    strays,
    write_marker,
)
from table.paths import NAME_FILE, local_path, unescape_partition_value
from table.schema import partition_clause, qualified, sql_string

log = logging.getLogger(__name__)

# How long replaced files stay readable after a swap, so that a query planned before it can still read them.
DEFAULT_GRACE_S = 300.0


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


def local_partitions(table_location: str) -> Iterator[PartitionRef]:
    table_dir = local_path(table_location)
    if table_dir is None:
        return
    for importer, root in importer_roots(table_dir):
        for escaped, date, pdir in partition_dirs(root):
            yield PartitionRef(importer, _value(escaped, pdir.parent), date, pdir, root)


def _value(escaped: str, app_dir: Path) -> str:
    """The partition value a directory holds: its unescaped name, or for a hash-named one what `_app_env` says."""
    try:
        return (app_dir / NAME_FILE).read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return unescape_partition_value(escaped)


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
    if not _unnamed_dirs(part.dir):
        return
    # Confirmed under the lock: a running compaction names its new directory in the marker under it.
    with root_lock(part.root):
        marker = read_marker(part.dir)
        keep = {marker.location, *marker.retire_dirs} if marker else set()
        for sub in part.dir.glob(f"{COMPACTED_PREFIX}*"):
            if sub.is_dir() and sub.name not in keep:
                log.info("removing %s, left by a compaction that did not finish", sub)
                remove_tree(sub)


def _unnamed_dirs(pdir: Path) -> bool:
    marker = read_marker(pdir)
    keep = {marker.location, *marker.retire_dirs} if marker else set()
    return any(sub.name not in keep for sub in pdir.glob(f"{COMPACTED_PREFIX}*"))


def _settle_swap(spark: Any, database: str, part: PartitionRef, marker: Marker, grace: float) -> None:
    location = partition_location(spark, database, part)
    if location is not None and location.resolve() == (part.dir / marker.location).resolve():
        marker.state, marker.previous = "done", None
        write_marker(part.dir, marker)
        log.info("finished the swap of %s to %s, which a killed compaction had made", part.dir, marker.location)
    else:
        write_marker(part.dir, marker_from_dict(marker.previous) if marker.previous else None)
        log.info("rolled back a compaction of %s that was killed before its swap", part.dir)


@dataclass(frozen=True, slots=True)
class SwapTimes:
    """Where a swap's time under the lock went: linking the kept files, the markers, the catalog's update."""

    link: float
    mark: float
    catalog: float


def swap_in(spark: Any, database: str, part: PartitionRef, marker: Marker | None, out: Path, sources: set[str],
            gen: int, grace: float) -> SwapTimes:
    """The locked step: link in every file not merged, mark, move the catalog's location, mark done."""
    started = time.monotonic()
    current = part.dir / marker.location if marker else part.dir
    kept = [p for p in data_files(current) if p.name not in sources]
    if marker is not None:
        kept += strays(part.dir, marker)
    for path in kept:
        os.link(path, out / path.name)  # a link, not a move: the old location keeps showing it until the swap
    deadline = time.time() + grace
    retire = dict(marker.retire) if marker else {}
    retire.update({p.name: deadline for p in data_files(part.dir) if p.name not in retire})
    retire_dirs = {**marker.retire_dirs, marker.location: deadline} if marker else {}
    swapping = Marker(gen=gen, state="swapping", retire=retire, retire_dirs=retire_dirs,
                      previous=dict(marker.__dict__) if marker else None)
    linked = time.monotonic()
    # Durable before the catalog moves: after a crash, "swapping" is what names the new directory.
    write_marker(part.dir, swapping)
    marked = time.monotonic()
    set_location(spark, database, part, out)
    moved = time.monotonic()
    swapping.state, swapping.previous = "done", None
    # Not fsynced: if a crash loses it, the marker reads "swapping" and is settled from the catalog.
    write_marker(part.dir, swapping, fsync="never")
    return SwapTimes(linked - started, marked - linked + time.monotonic() - moved, moved - marked)


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

