"""Compaction: merge a partition's small files into fewer, larger ones, and swap them in atomically.

Every group commit adds one file per partition it touches (43,200 a day at one commit every
2 s), so partitions are compacted while their day is still being written. Which files are
merged is the tier policy's choice (warehouse/tiers.py): a bounded number of rewrites per
row, a bounded number of files per partition. One compaction pass (`compact_table`):
1. plans one merge per partition that needs one, after settling what a killed run left;
2. has Spark read each merge's files and write them again, zstd with dictionaries: the
   merges that become one file each share one Spark job (the job's fixed cost is paid once
   per pass, not per partition); a merge into several target-size files has a job of its own.
   Row counts in the Parquet footers must match, or nothing is swapped;
3. per partition, under the importer root's lock (table/partition_files.py), builds
   `<partition dir>/_compacted-<gen>/`: the merged files plus hard links to every file of the
   current location it did not merge (including files the importer added meanwhile), writes
   `_compaction.json` in state "swapping", sets the catalog's location of the partition to the
   new directory (the atomic swap: one metastore update), and marks it "done";
4. the replaced files and directories are deleted `grace` seconds later, so a query
   planned before the swap can still read them.
Readers see either the old set of files or the new one, never a row missing or doubled.
A compaction killed at any point leaves the table correct: a marker left "swapping" is
settled by `recover` from the catalog (done if the location moved, rolled back otherwise),
and `_compacted-<n>/` dirs no marker names are the remains of a killed run and are deleted.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import uuid

import pyarrow.parquet as pq

from table.catalog import partition_clause
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
from warehouse.tiers import TARGET_BYTES, FileInfo, Pick, TierPolicy, leveled_name
from table.schema import COMPACT_OPTIONS, DATA_COLUMNS, qualified, spark_read_ddl, sql_string

log = logging.getLogger(__name__)

# How long one hold of an importer root's lock may go on swapping partitions.
SWAP_BUDGET_S = 0.5
# Merges into one file that share one Spark job.
MERGES_PER_JOB = 256
# Where a shared job writes before its files move to their partitions (skipped by readers: `_`).
SCRATCH = "_compaction"
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
            yield PartitionRef(importer, _value(escaped, pdir.parent), date, pdir, root)


def _value(escaped: str, app_dir: Path) -> str:
    """The partition value a directory holds: its unescaped name, or for a hash-named one what `_app_env` says."""
    try:
        return (app_dir / NAME_FILE).read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return unescape_partition_value(escaped)


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


def _rows(files: list[Path]) -> int:
    return sum(pq.read_metadata(p).num_rows for p in files)


@dataclass(frozen=True, slots=True)
class Merge:
    """One planned merge: which files of a partition's current location become which generation."""

    part: PartitionRef
    marker: Marker | None
    pick: Pick
    sources: tuple[Path, ...]
    gen: int
    rows: int

    @property
    def out(self) -> Path:
        return self.part.dir / f"{COMPACTED_PREFIX}{self.gen}"


def plan(spark: Any, database: str, part: PartitionRef, policy: TierPolicy, *, closed: bool,
         grace: float = DEFAULT_GRACE_S) -> Merge | None:
    """Settle what a killed run left, then the merge the tier policy wants for this partition (None: none)."""
    recover(spark, database, part, grace)
    marker = read_marker(part.dir)
    if marker is not None and strays(part.dir, marker):  # an importer died between its write and the move
        with root_lock(part.root):
            relocate_strays(part.dir)
    marker = read_marker(part.dir)
    current = part.dir / marker.location if marker else part.dir
    sizes = {}
    for path in data_files(current):
        with contextlib.suppress(FileNotFoundError):
            sizes[path.name] = path.stat().st_size
    pick = policy.pick([FileInfo(n, b) for n, b in sizes.items()], closed=closed)
    if pick is None:
        return None
    gen = max([marker.gen if marker else 0, *_generations(part.dir)]) + 1
    sources = tuple(current / n for n in pick.names)
    return Merge(part, marker, pick, sources, gen, _rows(list(sources)))


def write_merges(spark: Any, merges: list[Merge], scratch: Path) -> None:
    """Have Spark write every merge's output into its `_compacted-<gen>/` dir.

    Merges into one file share one job: each partition's rows are tagged, hashed to one task
    by the tag, and written under `<scratch>/_k=<tag>/`, whence they move to their partition.
    """
    for merge in merges:
        if merge.pick.files > 1:
            df = _read(spark, merge).coalesce(merge.pick.files)
            df.write.options(**COMPACT_OPTIONS).mode("overwrite").parquet(f"file://{merge.out}")
            _adopt_output(merge.out, merge.out, merge.pick.level)
    shared = [m for m in merges if m.pick.files == 1]
    for i in range(0, len(shared), MERGES_PER_JOB):
        chunk = shared[i : i + MERGES_PER_JOB]
        job = scratch / uuid.uuid4().hex
        frames = [_read(spark, m).selectExpr("*", f"{k} AS _k") for k, m in enumerate(chunk)]
        df = _union(frames).repartition(min(len(chunk), 4), "_k")
        df.write.options(**COMPACT_OPTIONS).mode("overwrite").partitionBy("_k").parquet(f"file://{job}")
        for k, merge in enumerate(chunk):
            merge.out.mkdir(parents=True, exist_ok=True)
            _adopt_output(job / f"_k={k}", merge.out, merge.pick.level)
        remove_tree(job)


def _read(spark: Any, merge: Merge) -> Any:
    return spark.read.schema(spark_read_ddl(data_only=True)).parquet(*[f"file://{p}" for p in merge.sources]) \
        .select(*DATA_COLUMNS)


def _union(frames: list[Any]) -> Any:
    # Pairwise, so that the plan is a balanced tree and not a chain hundreds deep.
    while len(frames) > 1:
        frames = [frames[i].unionByName(frames[i + 1]) if i + 1 < len(frames) else frames[i]
                  for i in range(0, len(frames), 2)]
    return frames[0]


def _adopt_output(src: Path, out: Path, level: int) -> None:
    """Give Spark's output files in `src` their level (warehouse/tiers.py) and move them into `out`."""
    for path in data_files(src):
        os.rename(path, out / leveled_name(path.name, level))
    for name in ("_SUCCESS",):
        (out / name).unlink(missing_ok=True)


def finish(spark: Any, database: str, merge: Merge, grace: float = DEFAULT_GRACE_S) -> Compacted:
    """Check the merge's output, then swap it in under the root's lock."""
    with root_lock(merge.part.root):
        return _swap_one(spark, database, merge, grace)


def swap_all(spark: Any, database: str, merges: list[Merge], grace: float = DEFAULT_GRACE_S,
             on_hold: Callable[[float], None] = lambda seconds: None) -> Iterator[tuple[Merge, Compacted | BaseException]]:
    """Swap every written merge in, root by root, holding each root's lock for about SWAP_BUDGET_S at a time.

    An importer writes back to back under load, and flock is not fair: a compaction that
    took the lock once per partition could wait behind write after write. So the swaps of
    one root are taken several to a hold, and a hold ends after about SWAP_BUDGET_S, which
    is the longest an importer's write waits for compaction.
    """
    by_root: dict[Path, list[Merge]] = {}
    for merge in merges:
        by_root.setdefault(merge.part.root, []).append(merge)
    for group in by_root.values():
        yield from _swap_checked(spark, database, group, grace, SWAP_BUDGET_S, on_hold)


def _swap_checked(spark: Any, database: str, merges: list[Merge], grace: float, budget: float,
                  on_hold: Callable[[float], None] = lambda seconds: None) -> Iterator[tuple[Merge, Compacted | BaseException]]:
    todo = list(merges)
    while todo:
        done: list[tuple[Merge, Compacted | BaseException]] = []
        with root_lock(todo[0].part.root):
            held = time.monotonic()
            while todo:
                merge = todo.pop(0)
                try:
                    done.append((merge, _swap_one(spark, database, merge, grace)))
                except (CompactionError, OSError) as e:
                    done.append((merge, e))
                if time.monotonic() - held >= budget:
                    break
            on_hold(time.monotonic() - held)
        yield from done


def _swap_one(spark: Any, database: str, merge: Merge, grace: float) -> Compacted:
    """With the root's lock held: check the output's row count, then swap."""
    started = time.monotonic()
    written = data_files(merge.out)
    rows = _rows(written)
    if rows != merge.rows:
        remove_tree(merge.out)
        raise CompactionError(f"compacting {merge.part.dir}: {merge.rows} rows in, {rows} out; nothing swapped")
    size_before = sum(p.stat().st_size for p in merge.sources)
    _swap(spark, database, merge.part, merge.marker, merge.out, {p.name for p in merge.sources}, merge.gen, grace)
    return Compacted(merge.part, len(merge.sources), len(written), rows, size_before,
                     sum(p.stat().st_size for p in written), time.monotonic() - started)


def compact_partition(spark: Any, database: str, part: PartitionRef, *, target_bytes: int = TARGET_BYTES,
                      grace: float = DEFAULT_GRACE_S, closed: bool = True,
                      policy: TierPolicy | None = None) -> Compacted | None:
    """Compact one partition now (as a closed day, unless told otherwise). Returns what was done."""
    merge = plan(spark, database, part, policy or TierPolicy(target_bytes=target_bytes), closed=closed, grace=grace)
    if merge is None:
        return None
    write_merges(spark, [merge], merge.part.root.parent / SCRATCH)
    return finish(spark, database, merge, grace)


def _generations(pdir: Path) -> list[int]:
    out = []
    for sub in pdir.glob(f"{COMPACTED_PREFIX}*"):
        with contextlib.suppress(ValueError):
            out.append(int(sub.name[len(COMPACTED_PREFIX):]))
    return out


def _swap(spark: Any, database: str, part: PartitionRef, marker: Marker | None, out: Path, sources: set[str],
          gen: int, grace: float) -> None:
    """The locked step: link in every file not merged, mark, move the catalog's location, mark done."""
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
    write_marker(part.dir, swapping)
    set_location(spark, database, part, out)
    swapping.state, swapping.previous = "done", None
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
