"""The table's commit protocol (table/protocol.py), step by step: every actor killed at every step, and two
actors interleaved at each step of one of them. After each: recover as the mesh does (an importer's
start, a compaction pass), then the invariants of docs/reliability.md hold:
1. every row a finished commit placed is in the table exactly once (a batch killed midway: whole or absent);
2. no row goes missing or doubles while compaction swaps and cleans up;
3. nothing is left aside: no unnamed `_compacted-*` dir after a pass, nothing staged, no `_dropped-*`;
4. no marker stops an importer or a pass.
The operations run in real child processes against the session's real Spark (tests/crash_points.py).
"""

from __future__ import annotations

import collections
import datetime
import os
import threading
import time
from pathlib import Path

import pytest

from importer.decode import BatchBuilder
from importer.write import TableWriter
from logjam.message import Message
from table.catalog import ensure_table
from table.paths import local_path, partition_dir
from table import protocol
from tests import crash_points as cp
from tests.spark_fixture import database_for
from warehouse.config import MaintenanceConfig
from warehouse.maintenance import maintenance_pass

pytestmark = pytest.mark.timeout(900)
TODAY = cp.today()
OLD = TODAY - datetime.timedelta(days=30)


class Seen:
    """How often each seq is in the table at one moment (a null seq counts as a row, not as a seq)."""

    def __init__(self, per_seq: dict[int | None, int]) -> None:
        self.per_seq = per_seq

    def counts(self, seqs: range | None = None) -> tuple[int, int]:
        """(rows, distinct seqs), as `count(*), count(DISTINCT seq)` of the table, of `seqs` or of all."""
        if seqs is None:
            return sum(self.per_seq.values()), sum(1 for seq in self.per_seq if seq is not None)
        hits = [n for seq, n in self.per_seq.items() if seq is not None and seqs.start <= seq < seqs.stop]
        return sum(hits), len(hits)


class Table:
    def __init__(self, spark_server, tmp: Path) -> None:
        self.tmp = tmp
        self.url = spark_server.url
        self.warehouse = tmp / "wh"
        self.database = database_for(self.warehouse)
        self.spark = spark_server.session()
        self.location = ensure_table(self.spark, self.database, str(self.warehouse / "messages"))
        self.table_dir = local_path(self.location)
        self.writer = TableWriter(self.database, 0, self.location)
        self.seq = 0

    def rows(self, per_stream: dict[str, int], day: datetime.date = TODAY, arrived: datetime.date | None = None):
        builder = BatchBuilder()
        created = int(datetime.datetime.combine(day, datetime.time(12), datetime.timezone.utc).timestamp() * 1000)
        at = int(datetime.datetime.combine(arrived or TODAY, datetime.time(12), datetime.timezone.utc).timestamp()
                 * 1e6) if arrived else int(datetime.datetime.now(datetime.timezone.utc).timestamp() * 1e6)
        first = self.seq + 1
        for app_env, n in per_stream.items():
            for _ in range(n):
                self.seq += 1
                builder.add(Message.build(app_env, "logs", {"message": f"m{self.seq}"}, seq=self.seq, device=3,
                                          created_ms=created), at)
        return builder.build(), range(first, self.seq + 1)

    def land(self, per_stream: dict[str, int], **kw) -> range:
        rows, seqs = self.rows(per_stream, **kw)
        self.writer.write(self.spark, rows)
        return seqs

    def counts(self, seqs: range | None = None) -> tuple[int, int]:
        """(rows, distinct seqs) the table shows now, of `seqs` or of all."""
        return self.seen().counts(seqs)

    def seen(self) -> Seen:
        """What a reader sees now, read in one query, for several checks of the same moment."""
        # Every row's seq, counted here: a scan without the shuffle a GROUP BY or DISTINCT costs Spark.
        rows = self.spark.sql(f"SELECT seq FROM {self.database}.messages").collect()
        return Seen(collections.Counter(row[0] for row in rows))

    def pdir(self, app_env: str, day: datetime.date = TODAY) -> Path:
        return Path(partition_dir(str(self.table_dir / "importer=0"), app_env, day.isoformat()))

    def recover(self) -> None:
        """What the mesh does after a crash: an importer starts, a maintenance pass runs."""
        cp_start = cp.OPERATIONS["start"]
        cp_start(self.spark, {"database": self.database, "location": self.location})
        self.writer = TableWriter(self.database, 0, self.location)
        maintenance_pass(self.spark, self.database, MaintenanceConfig(compact_grace=0.0, compact_fanin=2),
                         retention=False)

    def compaction_stopped_at_catalog(self) -> cp.Child:
        """A compaction pass in a child, stopped right before its first catalog update (a swap's)."""
        child = cp.stopped_at(self.tmp, self.url, self.database, self.location, "compact", 0, grace=0.0,
                              stop_on="catalog")
        assert child is not None, "the compaction moved no catalog location"
        return child

    def assert_clean(self) -> None:
        """Invariant 3 and 4 after recovery: nothing aside, every marker readable and naming a real dir."""
        staging = self.table_dir / "_staging" / "importer=0"
        assert not staging.exists() or list(staging.iterdir()) == []
        assert list(self.table_dir.glob("importer=0/_dropped-*")) == []
        for part in protocol.local_partitions(self.location):
            marker = protocol.read_marker(part.dir)
            names = {marker.location, *marker.retire_dirs} if marker else set()
            assert marker is None or (marker.state == "done" and (part.dir / marker.location).is_dir())
            assert {d.name for d in part.dir.glob("_compacted-*")} <= names, part.dir


def _kill(t: Table, operation: str, at: int, **extra) -> bool:
    return cp.kill_at(t.tmp, t.url, t.database, t.location, operation, at, **extra)


def _finished_or_waiting_on(thread: threading.Thread, lock: Path, timeout: float) -> None:
    """Wait until `thread` has ended or waits for the flock of `lock` (/proc/locks: "->", this pid), at most
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        thread.join(0.02)
        if not thread.is_alive() or _waiting_for(lock):
            return


def _waiting_for(lock: Path) -> bool:
    """Whether a thread of this process is blocked in flock() on `lock`."""
    try:
        st = lock.stat()
    except FileNotFoundError:
        return False
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[1:3] == ["->", "FLOCK"] and fields[5] == str(os.getpid()) and fields[6] == inode:
            return True
    return False


def _each_step(limit: int = 200):
    """1, 2, ... until the caller reports the operation finished before being killed there (every step covered)."""
    for at in range(1, limit + 1):
        yield at
    raise AssertionError(f"an operation of more than {limit} steps")


def _whole_or_absent(t: Table, seqs: range, landed: list[range], at: int) -> None:
    """After a commit killed at step `at` and the recovery: its batch `seqs` whole or absent (appended to `landed`
    when whole), every batch landed before once, nothing left aside."""
    seen = t.seen()
    count, distinct = seen.counts(seqs)
    assert count == distinct and count in (0, len(seqs)), f"killed at step {at}: {count} of {len(seqs)}"
    if count:
        landed.append(seqs)
    for done in landed:
        assert seen.counts(done) == (len(done), len(done)), f"killed at step {at}"
    t.assert_clean()


def test_a_commit_killed_at_every_step_is_whole_or_absent_after_recovery(spark_server, tmp_path) -> None:
    t = Table(spark_server, tmp_path)
    before = t.land({"a-prod": 20})
    for _ in range(3):
        t.land({"a-prod": 5})
    maintenance_pass(t.spark, t.database, MaintenanceConfig(compact_grace=0.0, compact_fanin=2), retention=False)
    assert protocol.read_marker(t.pdir("a-prod")) is not None  # a compacted partition: the batch's files follow it
    landed = [before]
    # A batch over a compacted, a fresh and a new partition, and a day before.
    streams = {"a-prod": 3, "b-prod": 2, "c-prod": 4}
    for at in _each_step():
        rows, seqs = t.rows(streams)
        if not _kill(t, "append", at, rows=cp.dump(rows, tmp_path / f"r{at}.parquet")):
            assert at > 6 and t.counts(seqs) == (len(seqs), len(seqs))
            break
        t.recover()
        _whole_or_absent(t, seqs, landed, at)


@pytest.mark.parametrize("swap", ["first", "compacted"])
def test_a_commit_killed_at_every_step_while_a_swap_moves_the_catalog_is_whole_or_absent(spark_server, tmp_path,
                                                                                          swap) -> None:
    """A swap moves the catalog with the root's lock let go, and a commit meanwhile places into both locations
    (for a partition's first swap, the dir itself and `_compacted-1/`). The swap is stopped there, a commit is
    killed at each of its steps, the swap goes on, the mesh recovers: the batch whole or absent, every earlier
    row once; unkilled, it is queryable at once."""
    t = Table(spark_server, tmp_path)
    landed = [t.land({"a-prod": 5}) for _ in range(4)]
    if swap == "compacted":
        maintenance_pass(t.spark, t.database, MaintenanceConfig(compact_grace=0.0, compact_fanin=2), retention=False)
        assert protocol.read_marker(t.pdir("a-prod")) is not None
    for at in _each_step():
        # A first swap each time: a new stream, named to sort (and so be swapped) before the earlier ones.
        app_env = "a-prod" if swap == "compacted" else f"n{999 - at:03d}-prod"
        landed += [t.land({app_env: 3}) for _ in range(2)]
        child = t.compaction_stopped_at_catalog()
        marker = protocol.read_marker(t.pdir(app_env))
        assert marker is not None and marker.state == "swapping"
        assert (marker.previous is None) == (swap == "first")
        rows, seqs = t.rows({app_env: 3})
        killed = _kill(t, "append", at, rows=cp.dump(rows, tmp_path / f"r{at}.parquet"))
        if not killed:
            assert at > 3 and t.counts(seqs) == (len(seqs), len(seqs)), "a commit during the swap is not queryable"
        cp.resume(child)
        assert protocol.read_marker(t.pdir(app_env)).state == "done"
        if not killed:
            assert t.counts(seqs) == (len(seqs), len(seqs)), "a commit during the swap is not queryable after it"
        t.recover()
        _whole_or_absent(t, seqs, landed, at)
        if not killed:
            break


def test_an_importer_start_killed_at_every_step_finishes_the_listed_placement(spark_server, tmp_path) -> None:
    """A start that finishes a killed commit's listed placement is itself killed at each of its steps;
    the next start finishes it: the batch lands whole, once, and nothing is left aside."""
    t = Table(spark_server, tmp_path)
    landed = [t.land({"a-prod": 10})]
    maintenance_pass(t.spark, t.database, MaintenanceConfig(compact_grace=0.0, compact_fanin=2), retention=False)
    staging = t.table_dir / "_staging" / "importer=0"
    streams = {"a-prod": 3, "b-prod": 2, "c-prod": 4}

    found: list[int] = []  # the commit's step after which its list is durable and a file placed

    def half_placed() -> range:
        """A batch whose commit was killed after its list was durable and its first file placed."""
        for at in found or _each_step():
            rows, seqs = t.rows(streams)
            assert _kill(t, "append", at, rows=cp.dump(rows, tmp_path / f"r{t.seq}.parquet")), "no half placement"
            if any(staging.glob(f"*{protocol.MOVES}")) and len(list(staging.glob("*.parquet"))) < len(streams):
                found[:] = [at]
                return seqs
            assert not found, f"the commit killed at step {at} is no longer half placed"
            t.recover()  # killed before that point: start over from a clean table
            if t.counts(seqs)[0]:
                landed.append(seqs)
        raise AssertionError("unreachable")

    for at in _each_step():
        seqs = half_placed()
        killed = _kill(t, "start", at)
        t.recover()
        seen = t.seen()
        assert seen.counts(seqs) == (len(seqs), len(seqs)), f"start killed at step {at}"
        landed.append(seqs)
        for done in landed:
            assert seen.counts(done) == (len(done), len(done)), f"start killed at step {at}"
        t.assert_clean()
        if not killed:
            break


def test_a_compaction_killed_at_every_step_loses_and_doubles_nothing(spark_server, tmp_path) -> None:
    t = Table(spark_server, tmp_path)
    config = {"grace": 0.0, "older_than": 0.0}  # yesterday is closed: its merge is Spark's, today's pyarrow's
    yesterday = TODAY - datetime.timedelta(days=1)
    for _ in range(4):
        t.land({"a-prod": 3, "b-prod": 2})
        t.land({"a-prod": 2}, day=yesterday)
    for at in _each_step():
        for _ in range(4):
            t.land({"a-prod": 3, "b-prod": 2})
        t.land({"a-prod": 2}, day=yesterday)
        expected = t.seq
        if not _kill(t, "compact", at, **config):
            assert at > 5 and t.counts() == (expected, expected)
            break
        assert t.counts() == (expected, expected), f"killed at step {at}: a reader saw rows missing or doubled"
        t.recover()
        assert t.counts() == (expected, expected), f"killed at step {at}, after recovery"
        t.assert_clean()


def test_an_importer_start_at_every_step_of_a_merge_leaves_its_output_alone(spark_server, tmp_path) -> None:
    """Finding 1: an importer's start deleted the `_compacted-*` dir of a compaction that had not yet named it.

    And a commit never waits for a compacted partition's catalog update: stopped there, the swap leaves the
    root's lock free, and the commit's rows are queryable at once, from both locations."""
    t = Table(spark_server, tmp_path)
    for _ in range(4):
        t.land({"a-prod": 3})
    for at in _each_step():
        for _ in range(4):
            t.land({"a-prod": 3})
        child = cp.stopped_at(t.tmp, t.url, t.database, t.location, "compact", at, grace=0.0)
        if child is None:
            assert at > 5
            break
        _start_and_commit_meanwhile(t, child, at)
    # Each pass differs from the one before, so step k of pass k need not be a catalog update: once more,
    # stopped right before one.
    for _ in range(4):
        t.land({"a-prod": 3})
    child = t.compaction_stopped_at_catalog()
    assert _start_and_commit_meanwhile(t, child, 0), "a commit waited for a swap's catalog update"


def _start_and_commit_meanwhile(t: Table, child: cp.Child, at: int) -> bool:
    """An importer's start and a commit while the compaction `child` is stopped at step `at` (0: before its
    catalog update; they may wait for its lock),
    then the compaction resumes and the mesh recovers. Returns whether they finished while it was stopped
    in a swap (the marker "swapping")."""
    later = t.rows({"a-prod": 2})[0]
    done: list[BaseException | None] = []

    def importer() -> None:
        try:
            cp.OPERATIONS["start"](t.spark, {"database": t.database, "location": t.location})
            TableWriter(t.database, 0, t.location).write(t.spark, later)
            done.append(None)
        except BaseException as e:  # reported below
            done.append(e)

    thread = threading.Thread(target=importer)
    thread.start()
    # Holding the root's lock, the stopped compaction keeps it waiting; it gets up to 5 s to do harm
    # otherwise, and once it waits on the lock there is nothing more it can do before the resume.
    _finished_or_waiting_on(thread, t.table_dir / "importer=0" / protocol.LOCK, 5)
    unblocked_in_swap = False
    if not thread.is_alive():  # it did not wait for the stopped compaction: its rows are queryable now
        assert done == [None], done
        assert t.counts() == (t.seq, t.seq), f"stopped at step {at}, before the compaction went on"
        marker = protocol.read_marker(t.pdir("a-prod"))
        unblocked_in_swap = marker is not None and marker.state == "swapping"
    cp.resume(child)
    thread.join(120)
    assert done == [None], done
    assert t.counts() == (t.seq, t.seq), f"stopped at step {at}"
    marker = protocol.read_marker(t.pdir("a-prod"))
    assert marker is None or (t.pdir("a-prod") / marker.location).is_dir()
    t.recover()
    assert t.counts() == (t.seq, t.seq)
    t.assert_clean()
    return unblocked_in_swap


def test_retention_killed_at_every_step_drops_whole_and_the_day_takes_rows_again(spark_server, tmp_path) -> None:
    t = Table(spark_server, tmp_path)
    keep = t.land({"a-prod": 4})
    t.land({"old-prod": 3, "gone-prod": 2}, day=OLD, arrived=OLD)
    for at in _each_step():
        if at > 1:
            t.land({"old-prod": 3, "gone-prod": 2}, day=OLD, arrived=OLD)
        if not _kill(t, "retention", at, days=7):
            assert at > 4 and t.counts() == (len(keep), len(keep))
            break
        cp.OPERATIONS["start"](t.spark, {"database": t.database, "location": t.location})
        cp.OPERATIONS["retention"](t.spark, {"database": t.database, "location": t.location, "days": 7})
        seen = t.seen()
        assert seen.counts(keep) == (len(keep), len(keep))
        assert seen.counts() == (len(keep), len(keep)), f"killed at step {at}: old rows left"
        assert not t.pdir("old-prod", OLD).exists() and not t.pdir("gone-prod", OLD).parent.exists()
        # The same writer, whose registration of the dropped partition is still cached, lands late rows there.
        late = t.land({"old-prod": 2}, day=OLD)
        assert t.counts(late) == (2, 2), f"killed at step {at}: late rows into a dropped day are not visible"
        t.spark.sql(f"ALTER TABLE {t.database}.messages DROP IF EXISTS PARTITION (importer=0, app_env='old-prod', "
                    f"date=DATE'{OLD}')")
        protocol.remove_tree(t.pdir("old-prod", OLD).parent)
        t.writer = TableWriter(t.database, 0, t.location)
        t.assert_clean()


def test_retention_between_a_registration_and_its_write_does_not_lose_the_rows(spark_server, tmp_path) -> None:
    """Finding 3: retention dropped a partition an importer had just registered (empty) and then wrote to."""
    t = Table(spark_server, tmp_path)
    rows, seqs = t.rows({"late-prod": 5}, day=OLD)  # late events, arriving now into a day past retention
    # Steps 1-3: the two dirs made and the catalog's ADD; 4: making sure the root exists, just before its lock.
    child = cp.stopped_at(t.tmp, t.url, t.database, t.location, "append", 4,
                          rows=cp.dump(rows, tmp_path / "late.parquet"))
    assert child is not None
    assert t.pdir("late-prod", OLD).is_dir()  # registered, empty
    cp.OPERATIONS["retention"](t.spark, {"database": t.database, "location": t.location, "days": 7})
    cp.resume(child)
    assert t.counts(seqs) == (5, 5)


def test_retention_meeting_a_live_first_swap_leaves_the_day_to_a_later_pass(spark_server, tmp_path) -> None:
    """An expired day's first merge is stopped right before its catalog update when retention runs: retention
    leaves that day alone (its rows readable), and once the swap is done the next retention drops it whole."""
    t = Table(spark_server, tmp_path)
    keep = t.land({"a-prod": 4})
    old = sum(len(t.land({"old-prod": 3}, day=OLD, arrived=OLD)) for _ in range(2))
    child = t.compaction_stopped_at_catalog()
    marker = protocol.read_marker(t.pdir("old-prod", OLD))
    assert marker is not None and marker.state == "swapping" and marker.previous is None, marker
    spec = {"database": t.database, "location": t.location, "days": 7}
    cp.OPERATIONS["retention"](t.spark, spec)
    assert t.pdir("old-prod", OLD).is_dir(), "retention dropped a day whose swap was moving the catalog"
    assert t.counts() == (len(keep) + old, len(keep) + old)
    cp.resume(child)
    assert protocol.read_marker(t.pdir("old-prod", OLD)).state == "done"
    assert t.counts() == (len(keep) + old, len(keep) + old)
    cp.OPERATIONS["retention"](t.spark, spec)
    assert t.counts() == (len(keep), len(keep))
    assert not t.pdir("old-prod", OLD).parent.exists()
    t.recover()
    t.assert_clean()


def test_a_torn_marker_is_rebuilt_and_stops_no_one(spark_server, tmp_path) -> None:
    """Finding 5: an empty `_compaction.json` wedged the importer writing that partition and every pass."""
    t = Table(spark_server, tmp_path)
    for _ in range(4):
        t.land({"a-prod": 3, "b-prod": 3})
    maintenance_pass(t.spark, t.database, MaintenanceConfig(compact_grace=0.0, compact_fanin=2), retention=False)
    pdir = t.pdir("a-prod")
    assert protocol.read_marker(pdir) is not None
    # A stray (an importer killed between its rename and the move into the compacted location) ...
    rows, seqs = t.rows({"a-prod": 4})
    from importer.place import place

    place(t.writer.target.map.apply(rows)[0].append_column("doc", t.writer.target.doc_encoder.column(rows)),
          tmp_path / "staging", t.table_dir / "importer=0", "torn")
    (pdir / protocol.MARKER).write_bytes(b"")  # ... and a marker torn to nothing
    with pytest.raises(protocol.TornMarker):
        protocol.read_marker(pdir)
    more = t.land({"a-prod": 2, "b-prod": 2})  # the importer goes on
    assert t.counts(more) == (4, 4)
    assert t.counts(seqs) == (4, 4)  # the stray was found by its rows and moved in, once
    result = maintenance_pass(t.spark, t.database, MaintenanceConfig(compact_grace=0.0, compact_fanin=2),
                              retention=False)
    assert result.failed == 0
    assert t.counts() == (t.seq, t.seq)
    assert protocol.read_marker(pdir).state == "done"
    t.assert_clean()


def test_a_retried_placement_places_each_file_once(tmp_path) -> None:
    """Finding 2: a retry after an error between renames placed the whole batch again."""
    from importer.place import place

    builder = BatchBuilder()
    for i, app_env in enumerate(["a-prod", "b-prod", "c-prod"] * 2):
        builder.add(Message.build(app_env, "logs", {"message": str(i)}, seq=i + 1, device=1), 1)
    table = builder.build().sort_by([("app_env", "ascending"), ("date", "ascending")])
    from importer.variant import DocEncoder

    table = table.append_column("doc", DocEncoder.load().column(table))
    staging, root = tmp_path / "_staging", tmp_path / "importer=0"
    day = table.column("date")[0].as_py().isoformat()
    for app_env in ("a-prod", "b-prod", "c-prod"):
        Path(partition_dir(str(root), app_env, day)).mkdir(parents=True)
    # The third partition's file cannot be renamed into place: a directory stands at its name.
    blocker = Path(partition_dir(str(root), "c-prod", day)) / "part-tok-2.snappy.parquet"
    blocker.mkdir()
    with pytest.raises(OSError):
        place(table, staging, root, "tok")
    assert len(list(root.rglob("*.parquet"))) == 2 + 1  # two placed, and the blocker
    blocker.rmdir()
    assert place(table, staging, root, "tok") == 1  # the retry renames only what was not placed
    assert sorted(p.parent.parent.name for p in root.rglob("*.parquet")) == ["app_env=a-prod", "app_env=b-prod",
                                                                             "app_env=c-prod"]
    assert list(staging.iterdir()) == []


def test_a_grace_period_is_not_shortened_by_a_wall_clock_step() -> None:
    """Finding 6: deadlines on the wall clock deleted replaced files early when the clock stepped forward."""
    deadline = protocol.Deadline.after(300)
    assert not deadline.passed(wall=deadline.wall + 10_000)  # the wall clock jumped: still within the grace
    assert deadline.passed(mono=deadline.mono + 1)
    other_boot = protocol.Deadline("another-boot", deadline.mono, deadline.wall)
    assert other_boot.passed(wall=deadline.wall + 1) and not other_boot.passed(wall=deadline.wall - 1)
    old = protocol.Marker.from_json({"gen": 2, "retire": ["x.parquet"], "retire_at": 5.0})
    assert old.retire["x.parquet"].passed()  # a marker of the older format: epoch seconds
