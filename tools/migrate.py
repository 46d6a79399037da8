"""`logjam-sql --migrate`: a table of the old layout (f8e2b8d and before) becomes the Delta table in its place,
every committed row once, and the importers resume after what it held. No Spark.

The old table and the Delta table have one location, `<warehouse>/messages` (table/paths.py). Which of
the old files hold committed rows is table/old_layout.py's; this module moves those rows, in three
steps, so that a kill at any moment leaves the old table whole or the finished Delta table, and running
it again finishes the job:

1. **Build.** The Delta table is built inside the old table's directory, in `_delta_build-<plan>/` (a
   name the old build's readers and writers skip, as every name starting with `_`), created as any
   writer of the mesh creates the table (table/delta.py `open_table`). The old partitions are read a
   batch at a time and committed a group at a time (`ROWS_PER_COMMIT`), `doc` made from `body` by the
   importer's encoder, the files laid out by the importers' writer properties. `<plan>` names what is
   to be moved (every committed file, by path and size); each commit carries the app transaction
   `logjam-migrate:<plan>` whose version counts the groups done, so a run after a kill goes on after
   the last group committed, and a group cut short by the kill left only files no commit names
   (deleted before step 2). If the old table changed meanwhile (its plan is another), the stale build
   is deleted and the build starts over; the old table is untouched so far.
   Each commit also carries, per device journal of its rows, the importers' app transactions
   (table/delta.py `app_id`): `logjam:<journal>` at the highest seq of that journal any importer's
   rows hold, and `logjam:<journal>:importer-<I>` at the highest seq of importer I's rows, both raised
   commit by commit and never lowered. Those are what an importer resumes after (its share's txn
   when it lands only some of a device's streams), as the old one resumed after the table's
   max(seq) per journal. Rows of device 0 and rows without a journal have none, as today.
2. **Swap.** The build's data directories move up into the table's directory (beside the old
   `importer=*` roots, which never held an `app_env=*` dir of their own), then `_delta_log` moves
   up: that one rename is where the directory turns from the old table into the Delta table.
3. **Set aside.** The old layout's entries (`importer=*`, `_staging`, compaction's and lookup's files)
   move to `<warehouse>/messages.before-delta/`, outside the table, where VACUUM does not reach them;
   delete that directory once satisfied. A run that finds the Delta table in place finishes this
   step and does nothing else.

Run it with the mesh stopped: the old build's writers would write rows the build does not have, and
today's importers refuse the old table until step 2 (`_refuse_older_format`). logjam-spark names the
Delta table in its catalog at its next start, replacing the old table's entry (table/catalog.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from importer.variant import DocEncoder
from runtime.durable import fsync_dir
from table import old_layout
from table.delta import NO_HOOKS, app_id, open_table, with_doc, writer_properties
from table.old_layout import Partition
from table.paths import local_path, table_path
from table.schema import ARROW_SCHEMA, DOC_ARROW_TYPE, DOC_COLUMN

log = logging.getLogger(__name__)

BUILD_PREFIX = "_delta_build-"
DELTA_LOG = "_delta_log"
LOCK = "_migrate.lock"
ASIDE_SUFFIX = ".before-delta"
MIGRATION_APP = "logjam-migrate"
# Partitions of fewer rows than SHARED_ROWS share a commit, at most PARTITIONS_PER_COMMIT of them and
# ROWS_PER_COMMIT rows (`--migrate-commit-rows`); a larger one is a commit of its own, streamed. Each
# partition of a commit keeps a writer open until the commit ends, with bloom filters sized for the
# commit's largest partition, so both bound its memory. Measured with delta-rs 1.6.6, one commit of 500
# partitions of 200 rows peaked at 389 MB of RSS with filters sized for 200 ids, 578 MB for 100,000 and
# 3.4 GB for 1,000,000; of 2,000 such partitions, at 905 MB.
SHARED_ROWS = 100_000
PARTITIONS_PER_COMMIT = 500
ROWS_PER_COMMIT = 1_000_000
# What a file's bloom filters are sized for, at most: a row group's rows (table/delta.py, maintenance's merges).
MAX_BLOOM_ROWS = 1_000_000
# The rows as the Delta table takes them: the Arrow columns, then `doc` (table/delta.py `with_doc`).
SCHEMA = ARROW_SCHEMA.append(pa.field(DOC_COLUMN, DOC_ARROW_TYPE))


class MigrationError(RuntimeError):
    """The migration cannot go on without a person (what is in the way is named)."""


@dataclass
class Migrated:
    """What one run did."""

    location: str
    already_delta: bool = False  # the Delta table was in place when it started
    nothing: bool = False  # no old table there
    partitions: int = 0  # old partitions with committed rows
    rows: int = 0  # rows committed by this run
    commits: int = 0  # commits made by this run
    resumed_at: int = 0  # groups an earlier run had committed
    journals: int = 0  # importers' app transactions (journals, and journals of one importer) this run raised
    aside: Path | None = None  # where the old layout's entries went
    seconds: float = 0.0


@dataclass(frozen=True)
class Plan:
    """The groups of old partitions, one commit each, in order; `id` names exactly these groups of these
    files, so that a run goes on after an earlier run's commits only where both planned alike."""

    groups: tuple[tuple[Partition, ...], ...]
    rows: Mapping[Partition, int]  # from the files' footers
    id: str

    @classmethod
    def of(cls, parts: list[Partition], table_dir: Path, rows_per_commit: int = ROWS_PER_COMMIT) -> Plan:
        sized = {p: p.rows() for p in parts}
        # By the Delta partition they land in: one partition's old shares (one per importer) side by side,
        # a day's partitions after each other.
        order = sorted((p for p, n in sized.items() if n), key=lambda p: (p.date, p.app_env, p.importer, p.value))
        groups: list[list[Partition]] = []
        taken = 0
        for part in order:
            n = sized[part]
            shared = groups and sized[groups[-1][0]] < SHARED_ROWS and n < SHARED_ROWS
            if not shared or taken + n > rows_per_commit or len(groups[-1]) >= PARTITIONS_PER_COMMIT:
                groups.append([])
                taken = 0
            groups[-1].append(part)
            taken += n
        described = [[[p.importer, p.value, p.date, sized[p],
                       [(str(f.relative_to(table_dir)), f.stat().st_size) for f in p.files]] for p in group]
                     for group in groups]
        digest = hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]
        return cls(tuple(tuple(g) for g in groups), sized, digest)


def migrate(warehouse: str, rows_per_commit: int = ROWS_PER_COMMIT) -> Migrated:
    """Move the old table at `<warehouse>/messages` into the Delta table there (this module's docstring)."""
    started = time.monotonic()
    location = table_path(warehouse)
    table_dir = local_path(location)
    if table_dir is None:
        raise MigrationError(f"{location} is not on a local disk; the old layout only ever was")
    done = Migrated(location)
    if not table_dir.is_dir():
        done.nothing = True
        return done
    with _locked(table_dir):
        if DeltaTable.is_deltatable(str(table_dir)):
            done.already_delta = True
        elif not old_layout.is_old_table(table_dir):
            done.nothing = True
            return done
        else:
            _build_and_swap(table_dir, done, rows_per_commit)
        done.aside = _set_aside(table_dir)
    done.seconds = time.monotonic() - started
    log.info("%s", summary(done))
    return done


def _build_and_swap(table_dir: Path, done: Migrated, rows_per_commit: int) -> None:
    plan = Plan.of(old_layout.partitions(table_dir), table_dir, rows_per_commit)
    done.partitions = sum(len(g) for g in plan.groups)
    build_dir = table_dir / f"{BUILD_PREFIX}{plan.id}"
    _discard_stale(table_dir, build_dir)
    build = open_table(str(build_dir))
    plan_app = f"{MIGRATION_APP}:{plan.id}"
    done.resumed_at = build.transaction_version(plan_app) or 0
    if done.resumed_at:
        log.info("going on after the %d groups of %d an earlier run committed", done.resumed_at, len(plan.groups))
    encoder = DocEncoder.load()
    raised: set[str] = set()
    for number in range(done.resumed_at, len(plan.groups)):
        group = plan.groups[number]
        progress = _progress(build, group)
        raised |= {t.app_id for t in progress}
        # The group's rows and its progress in one commit: a kill leaves both or neither.
        txns = [Transaction(plan_app, number + 1), *progress]
        most = max(plan.rows[p] for p in group)
        write_deltalake(build, pa.RecordBatchReader.from_batches(SCHEMA, _batches(group, encoder)), mode="append",
                        writer_properties=writer_properties(rows_per_file=min(most, MAX_BLOOM_ROWS)),
                        commit_properties=CommitProperties(app_transactions=txns),
                        post_commithook_properties=NO_HOOKS)
        build.update_incremental()
        done.commits += 1
        done.rows += sum(plan.rows[p] for p in group)
        log.info("committed group %d of %d (%d partitions)", number + 1, len(plan.groups), len(group))
    done.journals = len(raised)
    _delete_orphans(build, build_dir, table_dir)
    _move_up(build_dir, table_dir)
    # The one step that turns the directory into the Delta table: before it, the old table is whole.
    os.rename(build_dir / DELTA_LOG, table_dir / DELTA_LOG)
    fsync_dir(table_dir)
    shutil.rmtree(build_dir)  # only the emptied directories are left in it


def _progress(build: DeltaTable, group: tuple[Partition, ...]) -> list[Transaction]:
    """The importers' app transactions this group raises: per journal the highest seq any importer's rows
    hold, and per importer its own rows' highest."""
    highest: dict[str, int] = {}
    for part in group:
        for batch in old_layout.rows(part, ["device", "journal", "seq"]):
            groups = pa.Table.from_batches([batch]).group_by(["device", "journal"]).aggregate([("seq", "max")])
            for device, journal, seq in zip(*(groups.column(c).to_pylist() for c in ("device", "journal", "seq_max"))):
                if device and journal is not None:  # device 0 and journal-less rows are untracked (table/delta.py)
                    for key in (app_id(journal), app_id(journal, part.importer)):
                        highest[key] = max(highest.get(key, -1), seq)
    return [Transaction(a, v) for a, v in sorted(highest.items()) if v > (build.transaction_version(a) or -1)]


def _batches(group: tuple[Partition, ...], encoder: DocEncoder) -> Iterator[pa.RecordBatch]:
    for part in group:
        for batch in old_layout.rows(part):
            rows = pa.Table.from_batches([batch])
            yield from with_doc(rows, encoder.column(rows)).to_batches()


def _discard_stale(table_dir: Path, build_dir: Path) -> None:
    """Delete what a run for another plan left: its build, and data dirs it had moved up before the old
    table changed (an `app_env=*` dir beside the importers' roots is only ever a build's)."""
    for entry in table_dir.iterdir():
        stale = entry.name.startswith(BUILD_PREFIX) and entry != build_dir
        if stale or (entry.name.startswith("app_env=") and not build_dir.exists()):
            log.info("deleting %s, left by a migration of the table as it was before", entry)
            shutil.rmtree(entry)


def _delete_orphans(build: DeltaTable, build_dir: Path, table_dir: Path) -> None:
    """Files of groups a kill cut short, which no commit names: gone before the build is the table."""
    named = {str(local_path(uri)) for uri in build.file_uris()}
    # Deleting by name is only safe if the log's names are the disk's: a committed file seen as an
    # orphan would be lost. So every file the log names must be found first: in the build, or moved
    # up already by a run killed during `_move_up`.
    missing = sorted(p for p in named if not os.path.isfile(p)
                     and not (table_dir / Path(p).relative_to(build_dir)).is_file())
    if missing:
        raise MigrationError(f"the build's log names {len(missing)} files not found where expected, e.g. "
                             f"{missing[0]}; nothing deleted")
    for sub, _, files in os.walk(build_dir):
        if DELTA_LOG in Path(sub).relative_to(build_dir).parts:
            continue
        for name in files:
            path = os.path.join(sub, name)
            if path not in named:
                os.unlink(path)


def _move_up(build_dir: Path, table_dir: Path) -> None:
    """The build's data dirs into the table's dir, each renamed whole; into a dir an earlier run moved up
    already, what is not there yet."""
    for entry in sorted(build_dir.iterdir()):
        if entry.name != DELTA_LOG:
            _merge(entry, table_dir / entry.name)
    fsync_dir(table_dir)


def _merge(src: Path, dst: Path) -> None:
    if not dst.exists():
        os.rename(src, dst)
        fsync_dir(dst.parent)
        return
    if not src.is_dir() or not dst.is_dir():
        raise MigrationError(f"{dst} is in the way of {src}")
    for entry in sorted(src.iterdir()):
        _merge(entry, dst / entry.name)


def _set_aside(table_dir: Path) -> Path | None:
    """Move the old layout's entries out of the Delta table's dir; None when there is nothing of it.

    Only a dir with an importer's root or a build in it held the old table (a Delta table made by
    today's mesh is left alone), and the roots go last, so a run killed midway leaves that evidence
    for the next run. Everything but the Delta table's own entries goes: the old layout knew more
    names over its versions than are worth listing, and it is moved, not deleted."""
    builds = [e for e in table_dir.iterdir() if e.name.startswith(BUILD_PREFIX)]
    if not old_layout.is_old_table(table_dir) and not builds:
        return None
    if any((b / DELTA_LOG).exists() for b in builds):
        raise MigrationError(f"{table_dir} is a Delta table and holds an unfinished migration's build too; "
                             f"one of them is not this mesh's: move one away by hand")
    for build in builds:
        shutil.rmtree(build)  # emptied by the swap, left by a run killed before it deleted it
    keep = {DELTA_LOG, LOCK}
    old = [e for e in table_dir.iterdir() if e.name not in keep and not e.name.startswith("app_env=")]
    old.sort(key=lambda e: (e.name.startswith(old_layout.IMPORTER_PREFIX), e.name))
    aside = table_dir.with_name(f"{table_dir.name}{ASIDE_SUFFIX}")
    aside.mkdir(exist_ok=True)
    for entry in old:
        if (aside / entry.name).exists():
            raise MigrationError(f"{aside / entry.name} exists: {entry} cannot be set aside there")
        os.rename(entry, aside / entry.name)
    fsync_dir(aside)
    fsync_dir(table_dir)
    return aside


@contextlib.contextmanager
def _locked(table_dir: Path) -> Iterator[None]:
    """One migration of a table at a time (a flock, let go when its process dies)."""
    fd = os.open(table_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise MigrationError(f"another migration of {table_dir} is running") from None
        try:
            yield
        finally:
            (table_dir / LOCK).unlink(missing_ok=True)  # while still held: a later run takes a file of its own
    finally:
        os.close(fd)


def summary(done: Migrated) -> str:
    """One line for a person: what was moved, or why nothing was."""
    if done.nothing:
        return f"no table of the old layout at {done.location}: nothing to migrate"
    if done.already_delta and done.aside is None:
        return f"{done.location} is a Delta table already: nothing to migrate"
    if done.already_delta:
        return f"{done.location} was a Delta table already; set aside what the old layout left: {done.aside}"
    again = f", going on after {done.resumed_at} commits of an earlier run" if done.resumed_at else ""
    return (f"migrated {done.partitions} partitions of the old layout into the Delta table {done.location}: "
            f"{done.rows} rows in {done.commits} commits{again}, {done.journals} importers' app transactions "
            f"raised, in {done.seconds:.1f}s; the old files are in {done.aside} (delete it once satisfied)")

