"""The table's commit protocol: every state a partition's files can be in, and every move between them.

docs/reliability.md ("The table's commit protocol") is this module in prose, with the two it
builds on: table/marker.py (what `_compaction.json` says, and its deadlines) and table/placement.py
(a batch's list of moves); the names match.
A partition `(importer I, app_env A, date D)` has the directory
`<table>/importer=I/app_env=A/date=D/` (its *dir*). Its states:

- **fresh**: registered in the catalog with its dir as location; no marker. Rows are the dir's files.
- **compacted**: `_compaction.json` says "done", generation g; the catalog's location is
  `_compacted-<g>/`. Files in the dir that the marker does not retire are *strays* (placed
  by an importer, not yet moved into `_compacted-<g>/`); retired ones wait out their grace.
- **swapping**: the marker says "swapping": a compaction is inside its swap, or died there.
  A dead one is settled from the catalog: done if the location moved, rolled back to
  `previous` otherwise. A swap counts as live while the table's compaction lock is held.
- **dropping**: `_dropping` exists: retention decided to drop it and may have died. Whoever
  meets it under the lock finishes the drop (catalog, then disk).

The actors and their moves, each under the importer root's flock (`root_lock`) unless said:
- an importer *places* a batch (`finish_placement`): its staged files, named in a fsynced
  list, are renamed into their partitions; a retry or a restart finishes the same list, so
  a file is placed once. Then it *follows* each partition it wrote (`follow`): settles a
  swap, finishes a drop, moves its strays in. At start it does both for its whole root.
- a compaction owns its output dir `_compacted-<gen>/` from before its first byte: only the
  holder of the table's compaction lock deletes unnamed `_compacted-*` dirs (`reap`), never an
  importer. A swap links what it did not merge and marks "swapping" (`begin_swap`), moves the
  catalog (`move_catalog`) with the root lock let go (a writer meeting the live swap places into
  both locations, `follow`), marks "done" (`finish_swap`). `delete_retired` deletes what a swap
  replaced once its grace has passed.
- retention *drops* a partition (`drop`): decides again under the lock (skipping one in a live
  swap), marks it dropping,
  drops it from the catalog, deletes its dir and an app_env dir left empty.

A marker that cannot be read (torn by a power loss, truncated) is rebuilt from the catalog and
the directory (`load_marker`), so no torn file stops an importer or a maintenance pass.
Grace deadlines run on the boot's monotonic clock, so a wall-clock step never shortens one.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from runtime.durable import fsync_dir, replace_file
from table.marker import COMPACTED_PREFIX, MARKER, Deadline, Marker, TornMarker, read_marker, write_marker
from table.partition_files import data_files, importer_roots, partition_dirs, remove_tree
from table.paths import NAME_FILE, local_path, unescape_partition_value
from table.placement import MOVES, abandon_placement, finish_placement, listed_targets, read_list
from table.schema import partition_clause, qualified, sql_string

log = logging.getLogger(__name__)

DROPPING = "_dropping"
LOCK = "_lock"
# The table's compaction lock: one compaction at a time, held from its planning to its last swap.
COMPACTION_LOCK = "_compaction_lock"
DROPPED_PREFIX = "_dropped-"
# How long replaced files stay readable after a swap, so that a query planned before it can still read them.
DEFAULT_GRACE_S = 300.0


# -- partitions, the lock, the catalog ------------------------------------------------------------------------------

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


def partition_at(importer: int, root: Path, pdir: Path, spec: tuple[str, str] | None = None) -> PartitionRef:
    """The partition of a dir below `root`; `spec` (value, date) when the caller knows it (a hash-named dir)."""
    if spec is not None:
        return PartitionRef(importer, spec[0], spec[1], pdir, root)
    return PartitionRef(importer, _value(pdir.parent.name[len("app_env="):], pdir.parent), pdir.name[len("date="):],
                        pdir, root)


def _value(escaped: str, app_dir: Path) -> str:
    """The partition value a directory holds: its unescaped name, or for a hash-named one what `_app_env` says."""
    try:
        return (app_dir / NAME_FILE).read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return unescape_partition_value(escaped)


@contextlib.contextmanager
def root_lock(root: Path | None) -> Iterator[None]:
    """Hold the flock of one importer's root (no-op for a root that is not on a local disk)."""
    if root is None:
        yield
        return
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def compaction_running(table_dir: Path) -> bool:
    """Whether a process holds the table's compaction lock (warehouse/compaction.py), and so may be in a swap.

    Only tried, never waited for: the lock is taken and let go at once when it is free."""
    fd = os.open(table_dir / COMPACTION_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases the flock
    return False


def partition_location(spark: Any, database: str, part: PartitionRef) -> Path | None:
    """The catalog's location of the partition; None when the catalog does not have it."""
    try:
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED {qualified(database)} {part.clause}").collect()
    except Exception as e:  # noqa: BLE001 (Spark wraps "no such partition" in whatever its client raises)
        if "PARTITIONS_NOT_FOUND" in str(e) or "NoSuchPartition" in str(e):
            return None
        raise
    for row in rows:
        if row[0] == "Location":
            return local_path(str(row[1]))
    return None


def set_location(spark: Any, database: str, part: PartitionRef, directory: Path) -> None:
    spark.sql(f"ALTER TABLE {qualified(database)} {part.clause} SET LOCATION '{sql_string(f'file://{directory}')}'")


def drop_from_catalog(spark: Any, database: str, parts: list[PartitionRef]) -> None:
    if parts:
        spark.sql(f"ALTER TABLE {qualified(database)} DROP IF EXISTS " + ", ".join(p.clause for p in parts))


# -- reading a partition's state ------------------------------------------------------------------------------------

def load_marker(spark: Any, database: str, part: PartitionRef, grace: float = DEFAULT_GRACE_S) -> Marker | None:
    """The marker, rebuilt (and rewritten) from the catalog and the directory when torn. Caller holds the lock."""
    try:
        return read_marker(part.dir)
    except TornMarker as e:
        log.error("%s; rebuilding it from the catalog and the directory", e)
    marker = rebuild_marker(spark, database, part, grace)
    write_marker(part.dir, marker)
    return marker


def rebuild_marker(spark: Any, database: str, part: PartitionRef, grace: float) -> Marker | None:
    """What the marker must say, given where the catalog points: the one source of truth for readers.

    Every swap links or merges the whole previous location into the new one, so older
    `_compacted-*` dirs are retired, and a file of the dir is retired when its name or its rows
    are in the current location, a stray (to be moved in) when they are not.
    """
    location = partition_location(spark, database, part)
    if location is None or not location.name.startswith(COMPACTED_PREFIX):
        return None  # fresh (or dropped): the dir's own files are the rows
    gen = int(location.name[len(COMPACTED_PREFIX):])
    deadline = Deadline.after(grace)
    current = {p.name for p in data_files(location)}
    retire = {p.name: deadline for p in data_files(part.dir) if p.name in current or _rows_in(p, location)}
    older = {d.name: deadline for d in part.dir.glob(f"{COMPACTED_PREFIX}*") if d.is_dir() and _gen(d.name) < gen}
    return Marker(gen=gen, retire=retire, retire_dirs=older)


def _gen(name: str) -> int:
    try:
        return int(name[len(COMPACTED_PREFIX):])
    except ValueError:
        return -1


def _rows_in(path: Path, location: Path) -> bool:
    """Whether the rows of `path` are in `location`'s files: by (device, seq) for tracked rows, else by arrival time."""
    rows = pq.read_table(path, columns=["device", "seq", "ingested_at"])
    tracked = rows.filter(pc.not_equal(rows.column("device"), 0))
    if tracked.num_rows:
        wanted = {(d, s) for d, s in zip(tracked.column("device").to_pylist(), tracked.column("seq").to_pylist())}
        column, values = "seq", pa.array(sorted({s for _, s in wanted}), tracked.schema.field("seq").type)
    else:
        wanted = set(rows.column("ingested_at").to_pylist())
        column, values = "ingested_at", rows.column("ingested_at").unique()
    found: set = set()
    for other in data_files(location):
        table = pq.read_table(other, columns=["device", "seq", "ingested_at"])
        table = table.filter(pc.is_in(table.column(column), value_set=values))
        if column == "seq":
            found |= set(zip(table.column("device").to_pylist(), table.column("seq").to_pylist()))
        else:
            found |= set(table.column("ingested_at").to_pylist())
    return wanted <= found


def strays(pdir: Path, marker: Marker) -> list[Path]:
    """Files in the dir that the compacted location does not hold yet."""
    return [p for p in data_files(pdir) if p.name not in marker.retire]


def live_files(pdir: Path) -> list[Path]:
    """The files a reader of the partition sees now: in `_compacted-<gen>/` once compacted, else in the dir itself.

    For reporting (census, retention's counts): a torn marker reads as its dir here."""
    try:
        marker = read_marker(pdir)
    except TornMarker:
        marker = None
    if marker is not None and marker.state == "done":
        return data_files(pdir / marker.location)
    return data_files(pdir)


def is_dropping(pdir: Path) -> bool:
    return (pdir / DROPPING).exists()


def needs_follow(pdir: Path) -> bool:
    """Whether `follow` has anything to do (read without the lock, so that a pass over thousands of settled
    partitions takes no lock for them): a torn or swapping marker, or strays."""
    try:
        marker = read_marker(pdir)
    except TornMarker:
        return True
    return marker is not None and (marker.state == "swapping" or bool(strays(pdir, marker)))


# -- the importer's start: placements a killed process listed (table/placement.py) -----------------------------------

def recover_placements(staging: Path, root: Path | None,
                       ensure_dirs: Callable[[list[Path]], None] = lambda dirs: None) -> int:
    """At start, under the root's lock: finish the batches a killed process left listed, then remove what is
    staged but unlisted (never committed; replay brings those rows back) and probe leftovers.
    `ensure_dirs` makes sure the listed partitions are registered. Returns the batches finished."""
    if not staging.is_dir():
        return 0
    finished = 0
    with root_lock(root):
        lists = sorted(staging.glob(f"*{MOVES}"))
        for listed in lists:  # a list that replaces another was durable: the other one's rest is not to be placed
            replaced = read_list(listed)[1]
            if replaced is not None:
                abandon_placement(staging, replaced)
        for listed in lists:
            if listed.exists():
                ensure_dirs(sorted({Path(t).parent for s, t in listed_targets(listed) if os.path.exists(s)}))
                finish_placement(listed)
                finished += 1
        for stale in staging.iterdir():
            if stale.name.startswith("probe-") and stale.is_dir():
                remove_tree(stale)
            elif stale.is_file():
                stale.unlink(missing_ok=True)
    return finished


# -- following compaction and retention (writers) --------------------------------------------------------------------

def follow(spark: Any, database: str, part: PartitionRef, grace: float = DEFAULT_GRACE_S, *,
           compacting: bool = False) -> int:
    """With the root lock held: settle a dead swap, then move strays in. Returns files moved.

    `compacting`: the caller holds the table's compaction lock, so no swap is running. Otherwise a
    swap, whose catalog move runs with the root lock released (`move_catalog`), may be live; then
    the strays go into both of its locations (`_place_during_swap`) and the swap is left alone."""
    marker = load_marker(spark, database, part, grace)
    if marker is not None and marker.state == "swapping":
        if not compacting and compaction_running(part.root.parent):
            return _place_during_swap(part, marker)
        marker = _settle_swap(spark, database, part, marker, grace)
    if marker is None:
        return 0
    target = part.dir / marker.location
    moved = strays(part.dir, marker)
    for path in moved:
        if (target / path.name).exists():
            # The location holds this very file (a link; `_mark_done` retires the ones it sees): a rename onto
            # another link of the same file would do nothing and leave the stray for ever.
            os.unlink(path)
        else:
            os.rename(path, target / path.name)  # one rename per file: each file's rows appear whole, once
    if moved:
        fsync_dir(target)
        fsync_dir(part.dir)
    return len(moved)


def _place_during_swap(part: PartitionRef, marker: Marker) -> int:
    """Strays while a swap may be running: each is linked into the new location first, then renamed into the
    old one (a first swap's old location is the dir itself, which holds them already), so that whichever
    location the catalog names (now, after the swap, or after a rollback of a dead one) holds it once."""
    new = part.dir / marker.location
    old = part.dir / Marker.from_json(marker.previous).location if marker.previous else None
    moved = strays(part.dir, marker)
    for path in moved:
        if not (new / path.name).exists():
            os.link(path, new / path.name)
    if moved:
        fsync_dir(new)
    if old is not None and moved:
        for path in moved:
            os.rename(path, old / path.name)
        fsync_dir(old)
        fsync_dir(part.dir)
    return len(moved)


def _settle_swap(spark: Any, database: str, part: PartitionRef, marker: Marker, grace: float) -> Marker | None:
    location = partition_location(spark, database, part)
    if location is not None and location.resolve() == (part.dir / marker.location).resolve():
        _mark_done(part, marker, Deadline.after(grace))
        log.info("finished the swap of %s to %s, which a killed compaction had made", part.dir, marker.location)
        return marker
    previous = Marker.from_json(marker.previous) if marker.previous else None
    write_marker(part.dir, previous)
    log.info("rolled back a compaction of %s that was killed before its swap", part.dir)
    return previous


def _mark_done(part: PartitionRef, marker: Marker, deadline: Deadline) -> None:
    """Write the swap's marker as "done". A file a writer placed in the dir during a first swap, which the new
    location holds by a link, is retired with the others: a query planned before the swap may still read it
    in the dir, its old location."""
    location = part.dir / marker.location
    for path in data_files(part.dir):
        if path.name not in marker.retire and (location / path.name).exists():
            marker.retire[path.name] = deadline
    marker.state, marker.previous = "done", None
    write_marker(part.dir, marker)


def settle_root(spark: Any, database: str, importer: int, table_location: str) -> int:
    """At an importer's start: finish drops, settle swaps and move strays of its own root. Returns files moved.

    It deletes no `_compacted-*` dir: an unnamed one may be a live compaction's output (`reap`)."""
    moved = 0
    for part in local_partitions(table_location):
        if part.importer != importer:
            continue
        if is_dropping(part.dir):
            with root_lock(part.root):
                finish_drop(spark, database, [part])
            continue
        if (part.dir / MARKER).exists():
            with root_lock(part.root):
                moved += follow(spark, database, part)
    table_dir = local_path(table_location)
    reap_dropped(None if table_dir is None else table_dir / f"importer={importer}")
    return moved


# -- compaction ------------------------------------------------------------------------------------------------------

def reap(part: PartitionRef) -> int:
    """Delete `_compacted-*` dirs no marker names: the output of compactions that died. Only the holder of
    the table's compaction lock calls this (no other compaction can own such a dir then). Returns dirs removed."""
    if not any(part.dir.glob(f"{COMPACTED_PREFIX}*")):
        return 0
    with root_lock(part.root):
        try:
            marker = read_marker(part.dir)
        except TornMarker:
            return 0  # rebuilt first by whoever follows the partition; nothing is deleted on a guess
        keep = {marker.location, *marker.retire_dirs} if marker else set()
        if marker is not None and marker.previous:
            keep |= {Marker.from_json(marker.previous).location}
        removed = 0
        for sub in part.dir.glob(f"{COMPACTED_PREFIX}*"):
            if sub.is_dir() and sub.name not in keep:
                log.info("removing %s, left by a compaction that did not finish", sub)
                remove_tree(sub)
                removed += 1
    return removed


@dataclass(frozen=True, slots=True)
class SwapTimes:
    """Where a swap's time under the lock went: linking the kept files, the markers, the catalog's update."""

    link: float
    mark: float
    catalog: float


class SwapRefused(RuntimeError):
    """The partition changed under a planned merge (dropped, or its output is gone); nothing was swapped."""


@dataclass
class Swap:
    """A swap begun by `begin_swap`: its partition, its "swapping" marker, and where its time went so far."""

    part: PartitionRef
    out: Path
    marker: Marker
    grace: float
    link: float
    mark: float
    catalog: float = 0.0


def begin_swap(spark: Any, database: str, part: PartitionRef, out: Path, sources: set[str], gen: int,
               grace: float) -> Swap:
    """With the root lock held: link in every file not merged, then mark "swapping" (naming `out`)."""
    started = time.monotonic()
    if is_dropping(part.dir) or not part.dir.is_dir():
        raise SwapRefused(f"{part.dir} is being dropped")
    if not out.is_dir():
        raise SwapRefused(f"{out} is gone; nothing swapped")
    marker = load_marker(spark, database, part, grace)
    if marker is not None and marker.state == "swapping":
        marker = _settle_swap(spark, database, part, marker, grace)  # the caller holds the compaction lock: dead
    current = part.dir / marker.location if marker else part.dir
    if not all((current / name).exists() for name in sources):
        raise SwapRefused(f"{part.dir}: a merged file left its location; nothing swapped")
    kept = [p for p in data_files(current) if p.name not in sources]
    if marker is not None:  # a stray the location already holds is retired below, not linked twice
        kept += [p for p in strays(part.dir, marker) if not (current / p.name).exists()]
    for path in kept:
        os.link(path, out / path.name)  # a link, not a move: the old location keeps showing it until the swap
    fsync_dir(out)
    deadline = Deadline.after(grace)
    retire = dict(marker.retire) if marker else {}
    retire.update({p.name: deadline for p in data_files(part.dir) if p.name not in retire})
    retire_dirs = {**marker.retire_dirs, marker.location: deadline} if marker else {}
    swapping = Marker(gen=gen, state="swapping", retire=retire, retire_dirs=retire_dirs,
                      previous=marker.to_json() if marker else None)
    linked = time.monotonic()
    write_marker(part.dir, swapping)  # durable before the catalog moves: "swapping" names the new dir
    return Swap(part, out, swapping, grace, linked - started, time.monotonic() - linked)


def move_catalog(spark: Any, database: str, swap: Swap) -> None:
    """Point the catalog at the swap's output: readers move over in one update. With the root lock let go (a
    writer meanwhile places into both locations, `follow`), and the table's compaction lock held."""
    began = time.monotonic()
    set_location(spark, database, swap.part, swap.out)
    swap.catalog = time.monotonic() - began


def finish_swap(swap: Swap) -> SwapTimes:
    """With the root lock held, after `move_catalog`: mark the swap "done"."""
    began = time.monotonic()
    _mark_done(swap.part, swap.marker, Deadline.after(swap.grace))
    return SwapTimes(swap.link, swap.mark + time.monotonic() - began, swap.catalog)


def delete_retired(spark: Any, database: str, part: PartitionRef) -> int:
    """Delete what finished swaps replaced once each entry's grace has passed. Returns bytes freed.

    The caller holds the table's compaction lock. The files go before the marker stops naming
    them: a retired file the marker no longer named would read as a stray and be moved in again."""
    try:
        unlocked = read_marker(part.dir)
    except TornMarker:
        unlocked = None  # rebuilt under the lock below
    else:
        entries = [*unlocked.retire.values(), *unlocked.retire_dirs.values()] if unlocked else []
        if not any(at.passed() for at in entries):
            return 0
    freed = 0
    with root_lock(part.root):
        marker = load_marker(spark, database, part)
        if marker is None or marker.state != "done":
            return 0
        files = [name for name, at in marker.retire.items() if at.passed()]
        dirs = [name for name, at in marker.retire_dirs.items() if at.passed()]
        if not files and not dirs:
            return 0
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                freed += (part.dir / name).stat().st_size
                (part.dir / name).unlink()
            del marker.retire[name]
        for name in dirs:
            freed += remove_tree(part.dir / name)
            del marker.retire_dirs[name]
        fsync_dir(part.dir)
        write_marker(part.dir, marker)
    return freed


def adopt_compacted(spark: Any, database: str, table_location: str) -> int:
    """After partitions were recovered from the directory tree (a new metastore), point compacted ones at
    `_compacted-<gen>/`."""
    adopted = 0
    for part in local_partitions(table_location):
        with root_lock(part.root):
            try:
                marker = read_marker(part.dir)
            except TornMarker:
                marker = None  # the catalog is new: the newest generation is the best guess left
                gens = sorted(_gen(d.name) for d in part.dir.glob(f"{COMPACTED_PREFIX}*") if d.is_dir())
                if gens:
                    marker = Marker(gen=gens[-1])
            if marker is None:
                continue
            # The old metastore's answer is gone: the compacted copy holds every row the old files held.
            marker.state, marker.previous = "done", None
            write_marker(part.dir, marker)
            set_location(spark, database, part, part.dir / marker.location)
            follow(spark, database, part)
        adopted += 1
    return adopted


# -- retention -------------------------------------------------------------------------------------------------------

def drop(spark: Any, database: str, parts: list[PartitionRef],
         still_expired: Callable[[PartitionRef], bool]) -> list[PartitionRef]:
    """Drop partitions of one root: decided again under its lock, marked dropping, dropped from the catalog,
    deleted. Returns those dropped."""
    if not parts:
        return []
    with root_lock(parts[0].root):
        doomed = [p for p in parts if p.dir.is_dir() and (is_dropping(p.dir) or still_expired(p)) and not _in_swap(p)]
        for part in doomed:
            replace_file(part.dir / DROPPING, b"")
        finish_drop(spark, database, doomed)
    return doomed


def _in_swap(part: PartitionRef) -> bool:
    """Whether a compaction may be moving the partition's catalog location now: dropped next pass instead."""
    try:
        marker = read_marker(part.dir)
    except TornMarker:
        return False
    return marker is not None and marker.state == "swapping" and compaction_running(part.root.parent)


def finish_drop(spark: Any, database: str, parts: list[PartitionRef]) -> None:
    """With the root lock held: the catalog first (readers stop seeing it), then the dir is renamed out of
    the tree in one step (a writer then finds it missing and registers it anew), for `reap_dropped` to delete."""
    drop_from_catalog(spark, database, parts)
    for part in parts:
        if not part.dir.is_dir():
            continue  # finished by another actor meanwhile
        gone = part.root / f"{DROPPED_PREFIX}{uuid.uuid4().hex}"
        os.rename(part.dir, gone)
        app_dir = part.dir.parent
        if not any(p.name.startswith("date=") for p in app_dir.iterdir()):
            os.rename(app_dir, part.root / f"{DROPPED_PREFIX}{uuid.uuid4().hex}")
        fsync_dir(app_dir if app_dir.exists() else part.root)
        fsync_dir(part.root)


def reap_dropped(root: Path | None) -> int:
    """Delete what drops renamed out of the tree, and app_env dirs a killed drop left without a day.
    Returns bytes freed."""
    if root is None or not root.is_dir():
        return 0
    empty = [d for d in root.glob("app_env=*") if d.is_dir() and not any(d.glob("date=*"))]
    if empty:
        with root_lock(root):  # a writer registering a day there makes its dirs, then checks them under it
            for app_dir in empty:
                if app_dir.is_dir() and not any(app_dir.glob("date=*")):
                    os.rename(app_dir, root / f"{DROPPED_PREFIX}{uuid.uuid4().hex}")
            fsync_dir(root)
    return sum(remove_tree(d) for d in root.glob(f"{DROPPED_PREFIX}*") if d.is_dir())


def missing_dirs(dirs: Iterable[Path]) -> list[Path]:
    """Partition dirs a writer must (re-)register before placing into them: gone, or being dropped."""
    return [d for d in dirs if not d.is_dir() or is_dropping(d)]



