"""warehouse/maintenance.py on real delta-rs tables on a local disk: compaction, checkpoints, log cleanup,
retention and VACUUM keep every row exactly once, with a writer appending meanwhile and after a kill -9."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from harness.delta_rows import append, rows
from harness.processes import REPO, wait_for
from table import delta
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


def parquet_on_disk(location: str) -> set[str]:
    root = Path(location)
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


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


PASS = """
import sys
from warehouse.config import MaintenanceConfig
from warehouse.maintenance import maintenance_pass
maintenance_pass(sys.argv[1], MaintenanceConfig(compact_min_files=2, compact_older_than=0, checkpoint_every=3,
                                                vacuum_grace_hours=1, retention_days=30))
"""


@pytest.fixture(scope="module")
def many_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[tuple[str, int, int]]]:
    """A table of 8 closed partitions of 30 small files each: a pass takes a while to compact it."""
    location = str(tmp_path_factory.mktemp("many") / "messages")
    parts = [(f"app{i}-prod", TODAY - (1 + i % 2) * DAY) for i in range(8)]
    return location, fill(location, parts, 30, per=100)


def versions(location: str) -> int:
    return sum(1 for p in (Path(location) / "_delta_log").iterdir() if p.suffix == ".json")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("point", ["writing", "first-commit", "third-commit"])
def test_kill_9_in_the_middle_of_a_pass_then_a_fresh_pass(tmp_path: Path, many_files, point: str) -> None:
    source, expected = many_files
    location = str(tmp_path / "messages")
    shutil.copytree(source, location)
    files_before, commits = parquet_on_disk(location), versions(location)
    ready = {
        "writing": lambda: len(parquet_on_disk(location) - files_before) > 0,
        "first-commit": lambda: versions(location) > commits,
        "third-commit": lambda: versions(location) > commits + 2,
    }[point]
    proc = subprocess.Popen([sys.executable, "-c", PASS, location], cwd=REPO, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: ready() or proc.poll() is not None, timeout=120, interval=0.005, what=point)
        assert proc.poll() is None, f"the pass ended before {point}: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    assert keys(location) == expected  # readable, every row once, whatever the kill interrupted
    done = maintenance_pass(location, MaintenanceConfig(compact_min_files=2, compact_older_than=0, vacuum_grace_hours=0))
    assert done.failed == 0
    assert set(files_per_partition(location).values()) == {1}
    assert keys(location) == expected
    # The full VACUUM took what the killed pass wrote and never committed, and what compaction replaced.
    live = {p for p in pa.table(DeltaTable(location).get_add_actions())["path"].to_pylist()}
    assert parquet_on_disk(location) == live


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
