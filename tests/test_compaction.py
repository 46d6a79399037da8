"""Compaction and retention of the messages table, through `logjam-sql` against the session's real Spark.

Every check reads the table through the catalog, as a user would: no row missing or
doubled while compaction swaps a partition, rows written after a compaction queryable at
once, a compaction killed at each step finished by the next run, and retention dropping
exactly the old days from the catalog and the disk.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from table import protocol
from warehouse import compaction
from table.catalog import ensure_table
from importer.decode import BatchBuilder
from table.partition_files import data_files
from table.protocol import read_marker
from table.paths import local_path, partition_dir
from importer.write import TableWriter
from logjam.message import Message
from harness.processes import command, wait_for
from tests.spark_fixture import database_for
from warehouse.tiers import TierPolicy

DAY = datetime.date(2026, 1, 5)
APP = "shop-prod"


def created_ms(day: datetime.date) -> int:
    return int(datetime.datetime.combine(day, datetime.time(12), datetime.timezone.utc).timestamp() * 1000)


class Table:
    """One test's table on the shared server, written through the importer's own writer."""

    def __init__(self, spark_server, warehouse: Path, importer: int = 0) -> None:
        self.server = spark_server
        self.warehouse = warehouse
        self.database = database_for(warehouse)
        self.spark = spark_server.session()
        self.location = ensure_table(self.spark, self.database, str(warehouse / "messages"))
        self.writer = TableWriter(self.database, importer, self.location)
        self.seq = 0

    def land(self, rows: int, day: datetime.date = DAY, app_env: str = APP, arrived: datetime.date | None = None) -> None:
        """`rows` events of `day` that arrived on `arrived` (default: that day too)."""
        b = BatchBuilder()
        for _ in range(rows):
            self.seq += 1
            b.add(Message.build(app_env, "logs", {"message": f"m{self.seq}"}, seq=self.seq, device=3,
                                created_ms=created_ms(day)), created_ms(arrived or day) * 1000)
        self.writer.write(self.spark, b.build())

    def count(self, day: datetime.date = DAY, app_env: str = APP, spark=None) -> tuple[int, int]:
        row = (spark or self.spark).sql(
            f"SELECT count(*), count(DISTINCT seq) FROM {self.database}.messages "
            f"WHERE app_env = '{app_env}' AND date = DATE'{day}'").collect()[0]
        return int(row[0]), int(row[1])

    def pdir(self, day: datetime.date = DAY, app_env: str = APP, importer: int = 0) -> Path:
        return Path(partition_dir(f"{self.warehouse}/messages/importer={importer}", app_env, day.isoformat()))

    def sql(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([command("logjam-sql"), "--spark", self.server.url, "--warehouse", str(self.warehouse),
                               "--database", self.database, *args], capture_output=True, text=True, timeout=180)

    def compact(self, *extra: str) -> subprocess.CompletedProcess:
        done = self.sql("--compact", "--older-than", "0", *extra)
        assert done.returncode == 0, done.stderr + done.stdout
        return done


@pytest.mark.timeout(600)
def test_compaction_swaps_atomically_under_a_reader_and_follows_late_writes(spark_server, tmp_path) -> None:
    t = Table(spark_server, tmp_path / "wh")
    for _ in range(12):
        t.land(40)
    assert len(data_files(t.pdir())) == 12
    expected = (480, 480)

    from pyspark.sql import SparkSession

    reader = SparkSession.builder.remote(spark_server.url).create()
    seen: list[tuple[int, int]] = []
    failed: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        try:
            while not stop.is_set():
                seen.append(t.count(spark=reader))
        except BaseException as e:  # reported below: a query that lost its files is what grace prevents
            failed.append(e)

    # The replaced files stay GRACE seconds, longer than one of the reader's queries takes
    # from listing the files to reading them (about a second on a loaded CI machine, 1.6 s at a
    # load of 19 on 2 cores). The test waits the grace out below, so it is no longer than that.
    grace = 8.0
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(seen) >= 2 or failed, timeout=60, what="the reader's first counts")
        out = t.compact("--compact-grace", str(grace))
        swapped = time.time()
        assert "compacted 1 partitions" in out.stdout
        n = len(seen)
        wait_for(lambda: len(seen) >= n + 2 or failed, timeout=60, what="counts after the swap")
    finally:
        stop.set()
        thread.join(60)
        reader.stop()
    assert not failed, f"a reader's query failed across the swap: {failed[0]!r}"
    assert set(seen) == {expected}, f"a reader saw rows missing or doubled: {sorted(set(seen))}"

    marker = read_marker(t.pdir())
    assert marker is not None and marker.state == "done"
    assert len(data_files(t.pdir() / marker.location)) == 1
    assert len(data_files(t.pdir())) == 12, "the replaced files are kept for the grace period"
    time.sleep(max(0.0, swapped + grace + 0.5 - time.time()))  # the grace period itself is what is tested
    assert "compacted 0 partitions" in t.compact().stdout
    assert data_files(t.pdir()) == [], "past the grace period, a pass deletes the replaced files"
    # Late rows for the compacted day are queryable as soon as their writes return.
    t.land(7)
    t.land(3)
    assert t.count() == (490, 490)
    assert data_files(t.pdir()) == []
    # Compacting again merges the late files, and leaves the day's closing merge as it is (a closed
    # day that keeps receiving rows is merged in tiers, warehouse/tiers.py); nothing is lost or doubled.
    t.compact()
    assert t.count() == (490, 490)
    marker = read_marker(t.pdir())
    assert marker.gen == 2 and len(data_files(t.pdir() / marker.location)) == 2
    assert list(marker.retire_dirs) == ["_compacted-1"] and (t.pdir() / "_compacted-1").exists(), "kept for the grace period"
    # An importer's dedupe and recovery read the table: its max(seq) is what was landed.
    from table.catalog import max_seqs

    assert max_seqs(t.spark, t.database, 0)[3][None][0] == t.seq
    # A partition that is one file already, and today's open partition, are left alone.
    today = datetime.datetime.now(datetime.timezone.utc).date()
    t.land(5, day=today)
    t.land(5, day=today)
    assert "compacted 0 partitions" in t.compact().stdout
    assert len(data_files(t.pdir(today))) == 2


def compact_now(t: Table, part: protocol.PartitionRef) -> list:
    """Compact one partition as a closed day, through the steps a maintenance pass takes."""
    merge = compaction.plan(t.spark, t.database, part, TierPolicy(), closed=True, grace=0)
    assert merge is not None
    compaction.write_merges(t.spark, [merge], local_path(t.location) / compaction.SCRATCH)
    return list(compaction.swap_all(t.spark, t.database, [merge], grace=0))


@pytest.mark.timeout(600)
def test_a_killed_compaction_leaves_the_table_whole_and_the_next_run_finishes(spark_server, tmp_path) -> None:
    t = Table(spark_server, tmp_path / "wh")
    for _ in range(6):
        t.land(30)
    part = next(p for p in protocol.local_partitions(t.location) if p.date == DAY.isoformat())

    # 1. SIGKILL while Spark writes the compacted copy.
    proc = subprocess.Popen([command("logjam-sql"), "--spark", spark_server.url, "--warehouse", str(t.warehouse),
                             "--database", t.database, "--compact", "--older-than", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # A pass's Spark job writes below the table's scratch dir, then moves its files into `_compacted-<gen>/`.
        scratch = local_path(t.location) / compaction.SCRATCH
        wait_for(lambda: any(scratch.glob("*")) or any(t.pdir().glob("_compacted-*")) or proc.poll() is not None,
                 timeout=120, interval=0.005, what="compaction to start writing")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL, "the compaction ended before it could be killed"
    assert t.count() == (180, 180)

    # 2. Killed just after the catalog's location moved, before the marker said so.
    real_set_location = protocol.set_location

    def swap_then_die(*args, **kwargs):
        real_set_location(*args, **kwargs)
        raise SystemExit("killed after the swap")

    protocol.set_location = swap_then_die
    try:
        with pytest.raises(SystemExit):
            compact_now(t, part)
    finally:
        protocol.set_location = real_set_location
    assert read_marker(t.pdir()).state == "swapping"
    assert t.count() == (180, 180)
    # An importer's next write settles it and its rows are visible at once.
    t.land(3)
    assert read_marker(t.pdir()).state == "done"
    assert t.count() == (183, 183)

    # 3. Killed before the catalog's location moved: rolled back, then done by the next run.
    def die_before(*args, **kwargs):
        raise SystemExit("killed before the swap")

    t.land(3)
    protocol.set_location = die_before
    try:
        with pytest.raises(SystemExit):
            compact_now(t, part)
    finally:
        protocol.set_location = real_set_location
    assert t.count() == (186, 186)
    t.compact("--compact-grace", "0")
    assert t.count() == (186, 186)
    marker = read_marker(t.pdir())
    # The two late files merged into one beside the day's closing merge, which is not rewritten again.
    assert marker.state == "done" and len(data_files(t.pdir() / marker.location)) == 2
    assert sorted(p.name for p in t.pdir().glob("_compacted-*")) == [marker.location]


@pytest.mark.timeout(300)
def test_retention_drops_old_days_from_the_catalog_and_the_disk(spark_server, tmp_path) -> None:
    """Old days go; an old day that took late rows stays until the retention has passed since they arrived."""
    from warehouse.retention import expire

    t = Table(spark_server, tmp_path / "wh")
    today = datetime.datetime.now(datetime.timezone.utc).date()
    old, kept = today - datetime.timedelta(days=9), today - datetime.timedelta(days=6)
    arrived = today - datetime.timedelta(days=2)
    t.land(10, day=old)
    t.land(4, day=old, app_env="other-prod")
    t.land(3, day=old, app_env="late-prod", arrived=arrived)  # a shipper's backlog, 7 days late
    t.compact()  # the late rows' files are now Spark's compacted ones: those are read too
    t.land(5, day=kept)
    t.land(6, day=today)
    done = t.sql("--retention-days", "7")
    assert done.returncode == 0, done.stderr
    assert "retention dropped 2 partitions (14 rows)" in done.stdout
    assert not t.pdir(old).exists() and not t.pdir(old, "other-prod").exists()
    parts = [r[0] for r in t.spark.sql(f"SHOW PARTITIONS {t.database}.messages").collect()]
    assert not any(f"date={old}" in p and "late-prod" not in p for p in parts)
    assert any(f"date={kept}" in p for p in parts) and any(f"date={today}" in p for p in parts)
    total = t.spark.sql(f"SELECT count(*) FROM {t.database}.messages").collect()[0][0]
    assert total == 14 and t.count(old, "late-prod") == (3, 3)
    # Still there on the last day of the retention after its arrival; gone the day after.
    last = expire(t.spark, t.database, t.location, 7, today=arrived + datetime.timedelta(days=7))
    assert [p.app_env for p in last.held] == ["late-prod"]
    gone = expire(t.spark, t.database, t.location, 7, today=arrived + datetime.timedelta(days=8))
    assert [(p.app_env, p.date) for p in gone.partitions] == [("late-prod", old.isoformat())] and gone.rows == 3
    assert not t.pdir(old, "late-prod").exists()


@pytest.mark.timeout(600)
def test_todays_partition_is_compacted_in_levels_while_written_and_read(spark_server, tmp_path) -> None:
    """The open day: an importer writes, a reader counts, compaction passes run; nothing missing or doubled."""
    from pyspark.sql import SparkSession

    from warehouse.config import MaintenanceConfig
    from warehouse.maintenance import maintenance_pass
    from table.protocol import live_files
    from warehouse.tiers import level_of

    t = Table(spark_server, tmp_path / "wh")
    today = datetime.datetime.now(datetime.timezone.utc).date()
    landed = [0]
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: list[tuple[int, int, int]] = []  # (rows landed before the read began, count, distinct seqs)

    def write() -> None:
        try:
            while not stop.is_set():
                t.land(20, day=today)
                landed[0] = t.seq
        except BaseException as e:  # surfaced below
            errors.append(e)

    reader = SparkSession.builder.remote(spark_server.url).create()
    compactor = SparkSession.builder.remote(spark_server.url).create()

    def read() -> None:
        try:
            while not stop.is_set():
                before = landed[0]
                seen.append((before, *t.count(day=today, spark=reader)))
        except BaseException as e:  # surfaced below
            errors.append(e)

    config = MaintenanceConfig(retention_days=0, compact_target_bytes=128 * 2**20, compact_fanin=3,
                               compact_max_level=2, compact_grace=120.0, compact_older_than=3600.0)
    threads = [threading.Thread(target=write, daemon=True), threading.Thread(target=read, daemon=True)]
    for th in threads:
        th.start()
    merged = 0
    try:
        wait_for(lambda: landed[0] >= 60 or errors, timeout=120, what="the first writes")
        for _ in range(8):
            merged += maintenance_pass(compactor, t.database, config).compacted
            wait_for(lambda n=landed[0]: landed[0] >= n + 40 or errors, timeout=120, what="more writes")
    finally:
        stop.set()
        for th in threads:
            th.join(120)
        reader.stop()
    assert not errors, errors
    assert merged >= 2, "today's partition was compacted"
    assert t.count(day=today) == (landed[0], landed[0])
    bad = [s for s in seen if s[1] != s[2] or s[1] < s[0]]
    assert len(seen) >= 5 and not bad, f"a reader saw rows missing or doubled: {bad[:5]}"
    # The writer lands a file per write (milliseconds each) while a pass runs; one pass after
    # the writes leaves fewer level-0 files than the fan-in, however many came.
    merged += maintenance_pass(compactor, t.database, config).compacted
    live = live_files(t.pdir(today))
    levels = [level_of(p.name) for p in live]
    assert max(levels) >= 1 and all(v <= 2 for v in levels), levels
    assert levels.count(0) < 3, "level-0 files were merged"
    assert t.count(day=today) == (landed[0], landed[0])
    compactor.stop()


@pytest.mark.timeout(600)
def test_swaps_hold_an_importers_lock_briefly_and_let_it_in_between_holds(spark_server, tmp_path) -> None:
    """Many partitions swapped in one pass: a writer waiting on the root's lock gets it within about a second.

    A hold only links and writes markers (the catalog moves outside it), so 48 swaps fit the default
    budget of one hold; a budget of 10 ms makes the pass end holds and hand the lock over between them."""
    import time

    from table.protocol import root_lock

    t = Table(spark_server, tmp_path / "wh")
    apps = [f"svc{i:02d}-prod" for i in range(48)]
    for _ in range(2):
        b = BatchBuilder()
        for app in apps:
            t.seq += 1
            b.add(Message.build(app, "logs", {"message": f"m{t.seq}"}, seq=t.seq, device=3,
                                created_ms=created_ms(DAY)), created_ms(DAY) * 1000)
        t.writer.write(t.spark, b.build())
    parts = [p for p in protocol.local_partitions(t.location) if p.date == DAY.isoformat()]
    merges = [compaction.plan(t.spark, t.database, p, TierPolicy(), closed=True) for p in parts]
    assert len(merges) == len(apps) and all(merges)
    compaction.write_merges(t.spark, merges, local_path(t.location) / compaction.SCRATCH)

    holds: list[float] = []
    waits: list[float] = []
    done = threading.Event()
    root = parts[0].root

    def writer() -> None:  # what an importer's write does: take the lock, briefly
        while not done.is_set():
            asked = time.monotonic()
            with root_lock(root):
                waits.append(time.monotonic() - asked)
                time.sleep(0.005)
            time.sleep(0.005)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        results = list(compaction.swap_all(t.spark, t.database, merges, on_hold=holds.append, budget=0.01))
    finally:
        done.set()
        thread.join(30)
    assert all(not isinstance(r, BaseException) for _, r in results), results
    assert len(holds) >= 2, f"{len(apps)} swaps took {len(holds)} hold(s) of the lock; the budget did not end a hold"
    assert max(holds) <= 1.0, f"a hold lasted {max(holds):.2f}s"
    assert max(waits) <= 1.0, f"the writer waited {max(waits):.2f}s for the lock (holds: {holds})"
    assert len(waits) >= len(holds), "the writer got the lock between holds"
    # Every stream's two rows, once each, in one query (48 of t.count cost as many Spark jobs).
    counts = t.spark.sql(f"SELECT app_env, count(*), count(DISTINCT seq) FROM {t.database}.messages "
                         f"WHERE date = DATE'{DAY}' GROUP BY app_env").collect()
    assert {row[0]: (row[1], row[2]) for row in counts} == {a: (2, 2) for a in apps}
