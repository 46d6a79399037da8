"""warehouse/maintenance.py on real delta-rs tables on a local disk: compaction, checkpoints, log cleanup,
retention and VACUUM keep every row exactly once, with a writer appending meanwhile, and after a pass
killed with SIGKILL in each of its steps while a writer appends and a reader polls the table."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from harness.delta_rows import append, rows
from harness.processes import REPO
from table import delta
from tests.table_watch import LogWatch, PollingReader, freeze_when, kill_9, parquet_on_disk
from warehouse.config import MaintenanceConfig
from warehouse.delta_log import DeltaLog
from warehouse.maintenance import LOG_RETENTION, Maintainer, maintenance_pass
from warehouse.table_metrics import TableMetrics

TODAY = dt.datetime.now(dt.timezone.utc).date()
DAY = dt.timedelta(days=1)
# Every day before today is closed; nothing is ever deleted by VACUUM unless a test says so.
CONFIG = MaintenanceConfig(compact_min_files=4, compact_older_than=0, vacuum_grace_hours=1)


def keys(location: str) -> list[tuple[str, int, int]]:
    """Every row's (app_env, device, seq), read through the log by a fresh snapshot."""
    t = DeltaTable(location).to_pyarrow_table(columns=["app_env", "device", "seq"])
    return sorted(zip(t["app_env"].to_pylist(), t["device"].to_pylist(), t["seq"].to_pylist()))


def files_per_partition(location: str) -> dict[tuple[str, str], int]:
    a = pa.table(DeltaTable(location).get_add_actions(flatten=True))
    out: dict[tuple[str, str], int] = {}
    for env, date in zip(a["partition.app_env"].to_pylist(), a["partition.date"].to_pylist()):
        out[(env, str(date))] = out.get((env, str(date)), 0) + 1
    return out


def fill(location: str, parts: list[tuple[str, dt.date]], batches: int, per: int = 50) -> list[tuple[str, int, int]]:
    """`batches` commits, each of one file in every partition of `parts`; returns the rows' keys."""
    writer = delta.Writer(location)
    expected, seq = [], 0
    for _ in range(batches):
        batch = pa.concat_tables([rows(env, date, range(seq + i * per, seq + (i + 1) * per))
                                  for i, (env, date) in enumerate(parts)])
        append(writer, batch)
        expected += [(env, 1, s) for i, (env, _) in enumerate(parts) for s in range(seq + i * per, seq + (i + 1) * per)]
        seq += per * len(parts)
    return sorted(expected)


@pytest.mark.timeout(120)
def test_compaction_reduces_files_and_keeps_every_row_once(tmp_path: Path) -> None:
    location = str(tmp_path / "messages")
    parts = [("shop-prod", TODAY - 2 * DAY), ("shop-prod", TODAY - DAY), ("api-dev", TODAY - DAY)]
    expected = fill(location, parts, 12)
    assert set(files_per_partition(location).values()) == {12}
    done = maintenance_pass(location, CONFIG)
    assert (done.compacted, done.failed, done.conflicts) == (3, 0, 0)
    assert set(files_per_partition(location).values()) == {1}
    assert keys(location) == expected
    history = DeltaTable(location).history()
    optimize = [h for h in history if h["operation"] == "OPTIMIZE"]
    assert len(optimize) == 3 and all(h["operationMetrics"]["numFilesRemoved"] == 12 for h in optimize)
    # Nothing is due any more: the next pass commits nothing.
    version = DeltaTable(location).version()
    assert maintenance_pass(location, CONFIG, slow=False).compacted == 0
    assert DeltaTable(location).version() == version


@pytest.mark.timeout(120)
def test_an_open_day_waits_for_its_min_files(tmp_path: Path) -> None:
    location = str(tmp_path / "messages")
    fill(location, [("shop-prod", TODAY)], 3)
    maintainer = Maintainer(location, CONFIG)
    assert maintainer.run_pass(slow=False).compacted == 0  # 3 small files, the open day waits for 4
    fill(location, [("shop-prod", TODAY)], 1)
    assert maintainer.run_pass(slow=False).compacted == 1
    assert files_per_partition(location) == {("shop-prod", str(TODAY)): 1}


@pytest.mark.timeout(180)
def test_a_writer_appending_during_passes_loses_nothing(tmp_path: Path) -> None:
    location = str(tmp_path / "messages")
    delta.open_table(location)
    config = MaintenanceConfig(compact_min_files=2, compact_older_than=0, checkpoint_every=5, vacuum_grace_hours=1)
    stop, failures, written = threading.Event(), [], []

    def write() -> None:
        writer = delta.Writer(location)
        seq = 0
        try:
            while not stop.is_set() or seq < 40 * 20:
                env, date = ("shop-prod", TODAY) if seq % 40 == 0 else ("api-dev", TODAY - DAY)
                batch = rows(env, date, range(seq, seq + 20))
                append(writer, batch)
                written.extend((env, 1, s) for s in range(seq, seq + 20))
                seq += 20
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            failures.append(e)

    writer = threading.Thread(target=write)
    writer.start()
    maintainer = Maintainer(location, config, TableMetrics())
    compacted = checkpoints = passes = 0
    deadline = time.monotonic() + 120
    try:
        while (compacted < 3 or checkpoints < 2 or passes < 6) and time.monotonic() < deadline and not failures:
            done = maintainer.run_pass(slow=passes % 3 == 0)
            assert done.failed == 0
            compacted += done.compacted
            checkpoints += done.checkpoint is not None
            passes += 1
    finally:
        stop.set()
        writer.join(60)
    assert not failures, failures
    assert compacted >= 3 and checkpoints >= 2
    assert keys(location) == sorted(written)


@pytest.mark.timeout(120)
def test_retention_deletes_old_days_and_vacuum_removes_them_after_the_grace(tmp_path: Path) -> None:
    location = str(tmp_path / "messages")
    old = [("shop-prod", TODAY - 10 * DAY), ("api-dev", TODAY - 9 * DAY)]
    kept = [("shop-prod", TODAY - DAY), ("shop-prod", TODAY)]
    fill(location, old + kept, 2)
    old_files = {p for p in parquet_on_disk(location) if f"date={TODAY - 10 * DAY}" in p or f"date={TODAY - 9 * DAY}" in p}
    assert len(old_files) == 4
    config = MaintenanceConfig(retention_days=5, compact=False, vacuum_grace_hours=1)
    metrics = TableMetrics()
    done = maintenance_pass(location, config, metrics, compact=False)
    assert (done.dropped, done.rows_dropped, done.failed) == (4, 200, 0)
    assert metrics.retention_partitions._value.get() == 2  # noqa: SLF001
    assert {env for env, _, _ in keys(location)} == {"shop-prod"}
    assert set(files_per_partition(location)) == {(e, str(d)) for e, d in kept}
    delete = next(h for h in DeltaTable(location).history() if h["operation"] == "DELETE")
    assert delete["operationMetrics"]["num_copied_rows"] == 0 and delete["operationMetrics"]["num_added_files"] == 0
    assert old_files <= parquet_on_disk(location), "VACUUM must keep removed files for the grace"
    done = maintenance_pass(location, MaintenanceConfig(retention_days=5, vacuum_grace_hours=0), compact=False)
    assert done.vacuumed == 4
    assert not old_files & parquet_on_disk(location)
    assert len(keys(location)) == 200


@pytest.mark.timeout(120)
def test_checkpoints_every_n_commits_and_log_cleanup(tmp_path: Path) -> None:
    location = str(tmp_path / "messages")
    expected = fill(location, [("shop-prod", TODAY)], 7)
    config = MaintenanceConfig(compact=False, checkpoint_every=5, log_retention_hours=1)
    maintainer = Maintainer(location, config, TableMetrics())
    log = DeltaLog(location)
    assert log.last_checkpoint() is None
    aged = DeltaTable(location).version()  # 7 commits and the table's creation
    first = maintainer.run_pass(compact=False, slow=False)
    assert first.checkpoint == aged and log.last_checkpoint().version == aged  # type: ignore[union-attr]
    assert maintainer.run_pass(compact=False, slow=False).checkpoint is None  # 0 commits since
    # Two hours pass for everything written so far (the log's entries and the checkpoint).
    logdir = Path(location) / "_delta_log"
    before = time.time() - 7200
    for p in logdir.iterdir():
        os.utime(p, (before, before))
    expected = sorted(expected + fill(location, [("api-dev", TODAY)], 6))
    done = maintainer.run_pass(compact=False, slow=True)
    assert done.cleaned and done.failed == 0
    assert DeltaTable(location).metadata().configuration[LOG_RETENTION] == "interval 1 hours"
    names = {p.name for p in logdir.iterdir()}
    assert not any(f"{v:020d}.json" in names for v in range(aged))  # before the aged checkpoint
    assert f"{aged:020d}.checkpoint.parquet" in names and f"{aged + 6:020d}.json" in names
    assert keys(location) == expected  # a fresh reader starts from the checkpoint
    assert maintainer.metrics is not None and maintainer.metrics.log_files._value.get() == len(names)  # noqa: SLF001


# A pass as logjam-spark runs one, in a process of its own: every step has something to do on the
# `aged` table below.
PASS_CONFIG = MaintenanceConfig(compact_min_files=2, compact_older_than=0, checkpoint_every=3, vacuum_grace_hours=1,
                                retention_days=30, log_retention_hours=1)
PASS = f"""
import sys
from warehouse.config import MaintenanceConfig
from warehouse.maintenance import maintenance_pass
maintenance_pass(sys.argv[1], {PASS_CONFIG!r})
"""
OLD = [("old0-prod", TODAY - 40 * DAY), ("old1-prod", TODAY - 41 * DAY)]  # past the 30-day retention
ORPHANS = 1500
ORPHAN_DIR = f"app_env=gone-prod/date={TODAY - DAY}"  # a partition no commit names
LIVE = "live-prod"  # the writer's partitions during the test (today and yesterday)


class Aged:
    """The kill test's table: what it holds and what the pass has to do on it."""

    def __init__(self, location: str, kept: list[tuple[str, int, int]], old: list[tuple[str, int, int]],
                 checkpoint: int) -> None:
        self.location, self.kept, self.old, self.checkpoint = location, kept, old, checkpoint


@pytest.fixture(scope="module")
def aged(tmp_path_factory: pytest.TempPathFactory) -> Aged:
    """A table on which every step of a pass has work, so that a kill can be aimed at each: 8 closed
    partitions of 20 small files each (8 compactions), two days past a 30-day retention,
    a checkpoint and two commits after it, and, all made two hours old, its log (past a 1-hour log
    retention) and 1500 data files no commit names (a killed writer's, past a 1-hour VACUUM grace)."""
    location = str(tmp_path_factory.mktemp("aged") / "messages")
    parts = [(f"app{i}-prod", TODAY - (1 + i % 2) * DAY) for i in range(8)]
    kept = fill(location, parts, 20)
    old = fill(location, OLD, 3)
    table = DeltaTable(location)
    table.create_checkpoint()
    kept += fill(location, [("late-prod", TODAY - DAY)], 2)
    orphans = Path(location) / ORPHAN_DIR
    orphans.mkdir(parents=True)
    for i in range(ORPHANS):
        (orphans / f"part-99999-orphan-{i:05d}-c000.snappy.parquet").write_bytes(b"")
    before = time.time() - 7200
    for p in [*(Path(location) / "_delta_log").iterdir(), *orphans.glob("*orphan*")]:
        os.utime(p, (before, before))
    return Aged(location, sorted(kept), sorted(old), table.version())


def data_files(location: str, dirs: list[str]) -> set[str]:
    out = set()
    for d in dirs:
        with os.scandir(Path(location) / d) as it:
            out.update(f"{d}/{e.name}" for e in it if e.name.endswith(".parquet"))
    return out


def orphans_left(location: str) -> int:
    return sum(1 for name in os.listdir(Path(location) / ORPHAN_DIR) if "orphan" in name)


class Appender:
    """A writer appending as an importer does, in a thread: batches of 20 rows of device 2 into LIVE's
    today and yesterday, each commit with its journal's txn (table/delta.py `Writer.append`)."""

    APP_ID = delta.app_id("kill-test-journal")

    def __init__(self, location: str) -> None:
        self.location = location
        self.written: list[tuple[str, int, int]] = []
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        writer, seq = delta.Writer(self.location), 1
        try:
            while not self._stop.is_set():
                batch = rows(LIVE, TODAY - (seq // 20 % 2) * DAY, range(seq, seq + 20), device=2)
                writer.append(batch, pa.array([self.APP_ID] * batch.num_rows), {self.APP_ID: seq + 19})
                self.written.extend((LIVE, 2, s) for s in range(seq, seq + 20))
                seq += 20
                self._stop.wait(0.02)
        except BaseException as e:  # noqa: BLE001 (reported by stop())
            self.failures.append(e)

    def stop(self) -> list[tuple[str, int, int]]:
        self._stop.set()
        self._thread.join(60)
        assert not self.failures, self.failures
        return sorted(self.written)


def pass_points(location: str, log: LogWatch) -> dict[str, tuple[Any, Any]]:
    """Per point: (what shows on disk that the pass is at it, polled every 2 ms; what says, given what it
    showed, after the stop that the pass is still in that step and has not gone past it)."""
    base = log.scan().latest()
    dirs = sorted({str(Path(p).parent) for p in parquet_on_disk(location)} - {ORPHAN_DIR})
    files_before = data_files(location, dirs)
    aged_log = set(log.names())

    def checkpointed() -> list[str]:
        return [n for n in log.names() if n.endswith(".checkpoint.parquet") and int(n.split(".")[0]) > base]

    def ops(name: str) -> int:
        return log.scan().count(name, base)

    return {
        # Retention: the DELETE's commit is made; compaction has committed nothing yet.
        "retention": (lambda: ops("DELETE"), lambda _: ops("OPTIMIZE") == 0),
        # Compaction: a merged file written (a poll reads only the compacted partitions' directories, to
        # be quick: the file and its commit are milliseconds apart) and its OPTIMIZE not committed; then
        # its first and third commits.
        "compaction-writing": (lambda: data_files(location, dirs) - files_before,
                               lambda seen: bool(seen - log.scan().added(base))),
        "compaction-commit": (lambda: ops("OPTIMIZE") >= 1, lambda _: not checkpointed()),
        "compaction-third-commit": (lambda: ops("OPTIMIZE") >= 3, lambda _: not checkpointed()),
        # The checkpoint file is written; log cleanup has not begun (neither its property nor a deletion).
        "checkpoint": (checkpointed, lambda _: ops("SET TBLPROPERTIES") == 0 and aged_log <= set(log.names())),
        # Log cleanup is deleting the aged entries; VACUUM has not begun.
        "log-cleanup": (lambda: not aged_log <= set(log.names()), lambda _: ops("VACUUM START") == 0),
        # VACUUM is deleting the aged uncommitted files; its END is not committed.
        "vacuum": (lambda: orphans_left(location) < ORPHANS, lambda _: ops("VACUUM END") == 0),
    }


class Killed:
    """A copy of the aged table with a writer appending and a reader polling, whose pass was SIGKILLed."""

    def __init__(self, location: str, reader: PollingReader, appender: Appender, what: str) -> None:
        self.location, self.reader, self.appender, self.what = location, reader, appender, what


def kill_a_pass_at(point: str, tmp_path: Path, aged: Aged, attempts: int = 4) -> Killed:
    """Start a pass on a fresh copy of the table, with a writer and a reader, and SIGKILL it at `point`.

    The stop comes milliseconds after the point shows (more on a loaded machine), and some steps last
    only milliseconds: when the pass had gone past the point, that copy is given up (its reader's
    checks still hold) and another tries, up to `attempts`."""
    missed = []
    for attempt in range(1, attempts + 1):
        location = str(tmp_path / f"messages-{attempt}")
        shutil.copytree(aged.location, location)  # mtimes too
        log = LogWatch(location)
        ready, in_step = pass_points(location, log)[point]
        aged_log = set(log.names())
        reader = PollingReader(location, ["app_env", "device", "seq"], atomic=aged.old)
        appender = Appender(location)
        with open(tmp_path / "pass.log", "wb") as out:
            proc = subprocess.Popen([sys.executable, "-c", PASS, location], cwd=REPO, stdout=out,
                                    stderr=subprocess.STDOUT)
        try:
            seen = freeze_when(proc, ready, timeout=60, what=point)
            hit = in_step(seen)
        except AssertionError as e:
            reader.stop()
            appender.stop()
            raise AssertionError(f"{e}; the pass said: {(tmp_path / 'pass.log').read_text()[-2000:]}") from None
        finally:
            kill_9(proc)
        what = (f"attempt {attempt}: killed at {sorted(seen)[:1] if isinstance(seen, (set, list)) else seen}; aged "
                f"files left: {len(aged_log & set(log.names()))} of {len(aged_log)} in the log, "
                f"{orphans_left(location)} of {ORPHANS} uncommitted; the last commits {log.scan().operations(0)[-6:]}")
        if hit:
            return Killed(location, reader, appender, what)
        missed.append(what)
        reader.check(min_polls=0)
        appender.stop()
    raise AssertionError(f"every pass had gone past {point} when it stopped:\n" + "\n".join(missed))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("point", ["retention", "compaction-writing", "compaction-commit", "compaction-third-commit",
                                   "checkpoint", "log-cleanup", "vacuum"])
def test_kill_9_in_the_middle_of_a_pass_then_a_fresh_pass(tmp_path: Path, aged: Aged, point: str) -> None:
    """A pass SIGKILLed at a point of each of its steps while a writer appends and a reader polls the
    table twice a second: the reader never sees a row vanish or double (the old days go all at once,
    in the DELETE's commit), and after a fresh pass every row is in the table once, the old days,
    the aged log and the aged uncommitted files are gone, and every partition is compacted."""
    killed = kill_a_pass_at(point, tmp_path, aged)
    location, reader = killed.location, killed.reader
    print(f"{point}: {killed.what}")
    try:
        # Readable, and holding every row once, whatever the kill interrupted.
        now = keys(location)
        assert len(now) == len(set(now)) and set(aged.kept) <= set(now)
        assert set(aged.old) <= set(now) or not set(aged.old) & set(now)
        # A fresh pass, with the writer and the reader still going, finishes what the killed one left.
        done = Maintainer(location, PASS_CONFIG).run_pass()
        assert done.failed == 0, done
        assert orphans_left(location) == 0
        # Log cleanup deleted the aged entries before the newest checkpoint at or before the first young entry.
        names = set(os.listdir(Path(location) / "_delta_log"))
        assert not {f"{v:020d}.json" for v in range(aged.checkpoint)} & names
        time.sleep(1.0)  # two more polls
    finally:
        reader.stop()
        written = killed.appender.stop()
    print(f"{point}: {len(written)} rows appended meanwhile; {reader.summary()}")
    reader.check(min_polls=3)
    assert reader.most >= len(aged.kept)
    assert keys(location) == sorted(aged.kept + written)
    parts = files_per_partition(location)
    assert {parts[p] for p in parts if not p[0] == LIVE} == {1}
    assert not any(env.startswith("old") for env, _ in parts)
    # With no one writing or reading any more, a VACUUM without grace takes what the killed pass wrote
    # and never committed, and what compaction replaced.
    maintenance_pass(location, MaintenanceConfig(compact=False, vacuum_grace_hours=0), compact=False)
    live = set(pa.table(DeltaTable(location).get_add_actions())["path"].to_pylist())
    assert parquet_on_disk(location) == live
    assert keys(location) == sorted(aged.kept + written)


@pytest.mark.timeout(60)
def test_a_pass_with_nothing_due_is_cheap(tmp_path: Path) -> None:
    location = str(tmp_path / "messages")
    parts = [(f"app{i}-prod", TODAY - (i % 2) * DAY) for i in range(20)]
    fill(location, parts, 2)
    maintainer = Maintainer(location, MaintenanceConfig(compact_older_than=1e9), TableMetrics())
    maintainer.run_pass()  # the first pass: opens the snapshot, sets the log retention
    started = time.process_time()
    for _ in range(5):
        assert maintainer.run_pass(slow=False).compacted == 0
    assert (time.process_time() - started) / 5 < 0.25
    # A table written by other writers too: an append's new file is seen by the next pass.
    write_deltalake(location, rows("app0-prod", TODAY, range(10**6, 10**6 + 5)), mode="append",
                    post_commithook_properties=delta.NO_HOOKS)
    maintainer.run_pass(slow=False)
    assert maintainer.metrics is not None and maintainer.metrics.files._value.get() == 41  # noqa: SLF001
    assert pc.sum(pa.table(DeltaTable(location).get_add_actions())["num_records"]).as_py() == 40 * 50 + 5


@pytest.mark.timeout(60)
def test_retention_keeps_an_old_day_until_its_last_row_arrived_a_retention_ago(tmp_path: Path) -> None:
    location = str(tmp_path / "messages")
    old = TODAY - 10 * DAY
    late = rows("shop-prod", old, range(100, 105))  # arrived now, filed under an old day
    late = late.set_column(late.schema.get_field_index("ingested_at"), "ingested_at",
                           pa.array([dt.datetime.now(dt.timezone.utc)] * 5, late.schema.field("ingested_at").type))
    fill(location, [("shop-prod", old), ("api-dev", old - DAY)], 1)
    append(delta.Writer(location), late)
    done = maintenance_pass(location, MaintenanceConfig(retention_days=5, compact=False), compact=False)
    assert done.rows_dropped == 50  # api-dev's older day only: shop-prod's day holds rows that arrived today
    assert {e for e, _, _ in keys(location)} == {"shop-prod"} and len(keys(location)) == 55
