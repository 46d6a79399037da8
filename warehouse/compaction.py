"""Compaction: merge a partition's small files into fewer, larger ones, and swap them in atomically.

Every group commit adds one file per partition it touches (172,800 a day at an importer's commit
every 0.5 s), so partitions are compacted while their day is still being written. Which files are
merged is the tier policy's choice (warehouse/tiers.py): a bounded number of rewrites per
row, a bounded number of files per partition. One compaction pass (warehouse/maintenance.py,
`_compact_all`):
1. plans one merge per partition that needs one, after settling what a killed run left;
2. writes each merge: while the day is open, the files importers place are merged here by
   pyarrow, without Spark (warehouse/arrow_merge.py); the rest (a day's closing merge, which
   shreds `doc`, and files Spark wrote) Spark reads and writes again, zstd with dictionaries,
   each file's rows sorted by `created_at` with bloom filters on the ids (table/layout.py):
   the merges that become one file each share one Spark job (the job's fixed cost is paid once
   per pass, not per partition); a merge into several target-size files has a job of its own.
   Row counts in the Parquet footers must match, or nothing is swapped;
3. per partition, under the importer root's lock, builds
   `<partition dir>/_compacted-<gen>/`: the merged files plus hard links to every file of the
   current location it did not merge (including files the importer added meanwhile), writes
   `_compaction.json` in state "swapping", lets the lock go, sets the catalog's location of the
   partition to the new directory (the atomic swap: one metastore update), and under the lock
   again marks it "done" (the swap and its recovery are the table's commit protocol,
   table/protocol.py, which writers follow too);
4. the replaced files and directories are deleted `grace` seconds later, so a query
   planned before the swap can still read them.
Readers see either the old set of files or the new one, never a row missing or doubled.
A compaction owns its `_compacted-<gen>/` from before it writes a byte: it holds the table's
compaction lock (an flock, released when its process dies) from planning to swap, and only
the holder of that lock deletes `_compacted-*` dirs no marker names (`protocol.reap`). A
compaction killed at any point leaves the table correct: a marker left "swapping" is settled
from the catalog (done if the location moved, rolled back otherwise) by whoever meets it
first, and the next pass reaps its output.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import uuid

import pyarrow.parquet as pq

from runtime.durable import fsync_dir, fsync_file
from table import protocol
from table.partition_files import data_files, remove_tree
from table.protocol import COMPACTED_PREFIX, COMPACTION_LOCK, DEFAULT_GRACE_S, PartitionRef, SwapTimes, root_lock
from table.layout import LOOKUPS, Layout
from table.schema import DATA_COLUMNS, spark_read_ddl
from warehouse.arrow_merge import merge_files, mergeable
from warehouse.tiers import FileInfo, Pick, TierPolicy, leveled_name

log = logging.getLogger(__name__)

# How long one hold of an importer root's lock may go on swapping partitions.
SWAP_BUDGET_S = 0.5
# A pause between two holds of one root, in which an importer waiting on the lock takes it.
HOLD_GAP_S = 0.05
# A hold longer than this is logged with where its time went.
SLOW_HOLD_S = 1.0
# Merges into one file that share one Spark job.
MERGES_PER_JOB = 256
# Where a shared job writes before its files move to their partitions (skipped by readers: `_`).
SCRATCH = "_compaction"


class CompactionError(RuntimeError):
    """A compaction's output did not match its input; nothing was swapped."""


@dataclass(frozen=True, slots=True)
class Compacted:
    partition: PartitionRef
    files_before: int
    files_after: int
    rows: int
    bytes_before: int
    bytes_after: int
    swap: SwapTimes


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


def _rows(files: list[Path]) -> int:
    return sum(pq.read_metadata(p).num_rows for p in files)


@dataclass(frozen=True, slots=True)
class Merge:
    """One planned merge: which files of a partition's current location become which generation."""

    part: PartitionRef
    pick: Pick
    sources: tuple[Path, ...]
    gen: int
    rows: int
    closed: bool  # the day's closing merge or later: Spark writes it, shredding `doc`

    @property
    def out(self) -> Path:
        return self.part.dir / f"{COMPACTED_PREFIX}{self.gen}"


def plan(spark: Any, database: str, part: PartitionRef, policy: TierPolicy, *, closed: bool,
         grace: float = DEFAULT_GRACE_S) -> Merge | None:
    """Settle what killed runs left, then the merge the tier policy wants for this partition (None: none).

    The caller holds the table's compaction lock, so no other compaction owns a `_compacted-*` dir."""
    if protocol.is_dropping(part.dir):
        return None  # retention finishes it
    if protocol.needs_follow(part.dir):  # a dead swap, a torn marker, an importer's strays
        with root_lock(part.root):
            protocol.follow(spark, database, part, grace, compacting=True)
    marker = protocol.read_marker(part.dir)
    protocol.reap(part)  # after `follow`: the output of a swap it rolled back is unnamed now
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
    return Merge(part, pick, sources, gen, _rows(list(sources)), closed)


def write_merges(spark: Any, merges: list[Merge], scratch: Path, layout: Layout = LOOKUPS) -> int:
    """Write every merge's output into its `_compacted-<gen>/` dir, laid out by `layout`; returns how
    many Spark wrote.

    An open day's merge of files importers placed is written here by pyarrow; the others by
    Spark, where merges into one file share one job: each partition's rows are tagged, hashed
    to one task by the tag, and written under `<scratch>/_k=<tag>/`, whence they move to their
    partition.
    """
    by_spark = []
    for merge in merges:
        if not merge.closed and mergeable(merge.sources):
            merge_files(merge.sources, merge.out, merge.pick.level, merge.pick.files, layout)
        else:
            by_spark.append(merge)
    _spark_merges(spark, by_spark, scratch, layout)
    return len(by_spark)


def _spark_merges(spark: Any, merges: list[Merge], scratch: Path, layout: Layout) -> None:
    # Each file's rows sorted by created_at, with bloom filters sized for them (table/layout.py).
    for merge in merges:
        if merge.pick.files > 1:
            df = layout.sorted_frame(_read(spark, merge).coalesce(merge.pick.files))
            options = layout.spark_merge_options(-(-merge.rows // merge.pick.files))
            df.write.options(**options).mode("overwrite").parquet(f"file://{merge.out}")
            _adopt_output(merge.out, merge.out, merge.pick.level)
    shared = [m for m in merges if m.pick.files == 1]
    for i in range(0, len(shared), MERGES_PER_JOB):
        chunk = shared[i : i + MERGES_PER_JOB]
        job = scratch / uuid.uuid4().hex
        frames = [_read(spark, m).selectExpr("*", f"{k} AS _k") for k, m in enumerate(chunk)]
        # Sorted by the tag first, as partitionBy needs anyway, so this adds no second sort.
        df = layout.sorted_frame(_union(frames).repartition(min(len(chunk), 4), "_k"), "_k")
        options = layout.spark_merge_options(max(m.rows for m in chunk))
        df.write.options(**options).mode("overwrite").partitionBy("_k").parquet(f"file://{job}")
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
        target = out / leveled_name(path.name, level)
        os.rename(path, target)
        fsync_file(target)  # Spark fsyncs nothing: durable before the swap retires the sources
    fsync_dir(out)
    for name in ("_SUCCESS",):
        (out / name).unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class Checked:
    """A merge whose output holds as many rows as its sources: ready to swap in."""

    merge: Merge
    files_after: int
    bytes_before: int
    bytes_after: int


def check(merge: Merge) -> Checked:
    """Count the output's rows against the merge's, outside any lock: the output dir is the compaction's own."""
    written = data_files(merge.out)
    rows = _rows(written)
    if rows != merge.rows:
        remove_tree(merge.out)
        raise CompactionError(f"compacting {merge.part.dir}: {merge.rows} rows in, {rows} out; nothing swapped")
    return Checked(merge, len(written), sum(p.stat().st_size for p in merge.sources),
                   sum(p.stat().st_size for p in written))


def swap_all(spark: Any, database: str, merges: list[Merge], grace: float = DEFAULT_GRACE_S,
             on_hold: Callable[[float], None] = lambda seconds: None,
             budget: float = SWAP_BUDGET_S) -> Iterator[tuple[Merge, Compacted | BaseException]]:
    """Swap every written merge in, root by root, holding each root's lock for about `budget` seconds at a time.

    An importer writes back to back under load, and flock is not fair: a compaction that
    took the lock once per partition could wait behind write after write. So the swaps of
    one root are taken several to a hold. A hold stops before a swap that would likely take
    it past the budget (judged by its slowest swap so far), which bounds how long an
    importer's write waits for compaction, and the next hold of that root waits HOLD_GAP_S,
    so that an importer blocked on the lock gets it in between.
    """
    by_root: dict[Path, deque[Checked]] = {}
    for merge in merges:
        try:
            by_root.setdefault(merge.part.root, deque()).append(check(merge))
        except (CompactionError, OSError) as e:
            yield merge, e
    for todo in by_root.values():
        while todo:
            yield from _hold(spark, database, todo, grace, budget, on_hold)
            if todo:
                time.sleep(HOLD_GAP_S)


def _hold(spark: Any, database: str, todo: deque[Checked], grace: float, budget: float,
          on_hold: Callable[[float], None]) -> list[tuple[Merge, Compacted | BaseException]]:
    """One hold of a root's lock: begin swaps from the head of `todo` while the budget allows.

    The catalog moves after the lock is let go, and each swap is marked done in a second, short
    hold: an importer's write never waits for a catalog update (a writer that meets a live
    swap places into both of its locations, protocol.follow)."""
    done: list[tuple[Merge, Compacted | BaseException]] = []
    begun: list[tuple[Checked, protocol.Swap]] = []
    root = todo[0].merge.part.root
    with root_lock(root):
        held = time.monotonic()
        slowest = 0.0
        while todo:
            checked = todo.popleft()
            began = time.monotonic()
            try:
                begun.append((checked, _begin(spark, database, checked, grace)))
            except (OSError, protocol.SwapRefused, protocol.TornMarker) as e:
                done.append((checked.merge, e))
            slowest = max(slowest, time.monotonic() - began)
            if time.monotonic() - held + slowest > budget:
                break
        seconds = time.monotonic() - held
    for _, swap in begun:  # no root lock: a writer meanwhile places into both locations (protocol.follow)
        protocol.move_catalog(spark, database, swap)
    if begun:
        with root_lock(root):
            finishing = time.monotonic()
            done += [(checked.merge, _compacted(checked, protocol.finish_swap(swap))) for checked, swap in begun]
            seconds += time.monotonic() - finishing
    on_hold(seconds)
    if seconds > SLOW_HOLD_S:
        times = [c.swap for _, c in done if isinstance(c, Compacted)]
        log.warning("held %s's lock for %.2fs for %d swaps (linking %.2fs, markers %.2fs; the catalog's %.2fs "
                    "outside it)", root, seconds, len(done), sum(t.link for t in times), sum(t.mark for t in times),
                    sum(t.catalog for t in times))
    return done


def _begin(spark: Any, database: str, checked: Checked, grace: float) -> protocol.Swap:
    merge = checked.merge
    return protocol.begin_swap(spark, database, merge.part, merge.out, {p.name for p in merge.sources}, merge.gen,
                               grace)


def _compacted(checked: Checked, swap: SwapTimes) -> Compacted:
    merge = checked.merge
    return Compacted(merge.part, len(merge.sources), checked.files_after, merge.rows, checked.bytes_before,
                     checked.bytes_after, swap)


def _generations(pdir: Path) -> list[int]:
    out = []
    for sub in pdir.glob(f"{COMPACTED_PREFIX}*"):
        with contextlib.suppress(ValueError):
            out.append(int(sub.name[len(COMPACTED_PREFIX):]))
    return out


