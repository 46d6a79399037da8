"""No stream can wedge an importer: names at the device's limits, the day's cap of new streams, quarantine.

Through a real logjam-device, the real Producer, a real logjam-importer and the session's
real logjam-spark. Every name the device accepts lands, and `WHERE app_env = '<name>'` (or
`original_app_env`, for a stand-in partition) finds its rows; a stream whose directory is in
the way is quarantined while the others keep landing; a write that fails for every stream
makes /healthz unhealthy with its cause and lands everything once the cause is gone.
"""

from __future__ import annotations

import datetime
import os
import shutil
import time
from pathlib import Path

import pytest

from table.paths import MAX_DIR_NAME, OVERFLOW, QUARANTINE, partition_dir
from logjam.producer import Producer
from harness.processes import wait_for
from tests.spark_fixture import database_for, table
from tests.test_health import healthz
from tests.test_importer import Importer

NAMES = [
    "a-" + "x" * 253,  # 255 bytes: `app_env=` plus the name is longer than a file name may be
    "a-" + "%" * 253,  # escaped, longer than the metastore keeps a partition name: a stand-in value
    "quo'te\"s-prod",
    "back\\slash-prod",
    "per%cent-prod",
    "equ=als-prod",
    "sla/sh-prod",
    "sp ace-prod",
    "plain-prod",
]


def sent_rows(device, names: list[str], per: int) -> int:
    with Producer(device.router) as p:
        for name in names:
            for i in range(per):
                p.submit(name, "logs.test", {"message": f"{name[:20]} {i}"})
        assert p.flush().accepted == per * len(names)
    return per * len(names)


def where(spark_server, warehouse: Path, condition: str) -> int:
    spark = spark_server.session()
    return spark.sql(f"SELECT count(*) FROM {database_for(warehouse)}.messages WHERE {condition}").collect()[0][0]


def sql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


@pytest.mark.timeout(300)
def test_every_name_the_device_accepts_lands_and_is_found_by_its_name(device, spark_server, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    imp = Importer(device, spark_server.url, "--flush-interval", "0.5", warehouse=warehouse)
    try:
        imp.wait_ready(device)
        # The device's own limit: it refuses a name with bytes beyond ASCII (400), so none reaches the table.
        with Producer(device.router) as p:
            p.submit("caf\u00e9-prod", "logs.test", {"message": "x"})
            assert p.flush().accepted == 0
        total = sent_rows(device, NAMES, 3)
        df = table(spark_server, warehouse)
        wait_for(lambda: df.where(df.topic == "logs.test").count() >= total, timeout=120, interval=0.5,
                 what=f"{total} rows")
        assert df.where(df.topic == "logs.test").count() == total
        for name in NAMES:
            found = where(spark_server, warehouse,
                          f"app_env = '{sql_string(name)}' OR original_app_env = '{sql_string(name)}'")
            assert found == 3, f"{name[:30]!r}: {found} rows found by name"
        assert where(spark_server, warehouse, f"app_env = '{sql_string(NAMES[0])}'") == 3, \
            "a name too long for a directory keeps its own partition value"
        for top, _dirs, files in os.walk(warehouse):
            for entry in [*_dirs, *files]:
                assert len(entry.encode()) <= 255, entry
        assert any(d.startswith("app_env=~d") for d in os.listdir(warehouse / "messages" / "importer=0"))
    finally:
        assert imp.stop() == 0, imp.output()


@pytest.mark.timeout(300)
def test_new_streams_past_the_days_cap_land_in_the_overflow_partition(device, spark_server, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    imp = Importer(device, spark_server.url, "--flush-interval", "0.5", "--max-new-app-envs", "3",
                   warehouse=warehouse)
    try:
        imp.wait_ready(device)  # the probe stream is the day's first partition
        names = [f"burst{i}-prod" for i in range(6)]
        total = sent_rows(device, names, 2)
        df = table(spark_server, warehouse)
        wait_for(lambda: df.where(df.topic == "logs.test").count() >= total, timeout=120, interval=0.5,
                 what=f"{total} rows")
        spark = spark_server.session()
        parts = [r[0] for r in spark.sql(f"SHOW PARTITIONS {database_for(warehouse)}.messages").collect()]
        own = [p for p in parts if "app_env=burst" in p]
        assert len(own) == 2 and sum(f"app_env={OVERFLOW}" in p for p in parts) == 1, parts
        assert where(spark_server, warehouse, f"app_env = '{OVERFLOW}'") == 8
        for name in names:
            assert where(spark_server, warehouse, f"app_env = '{name}' OR original_app_env = '{name}'") == 2
        wait_for(lambda: imp.metric("logjam_importer_app_envs_overflowed_total") == 4, timeout=10,
                 what="the overflow metric")
    finally:
        assert imp.stop() == 0, imp.output()
    assert "--max-new-app-envs" in imp.output()


@pytest.mark.timeout(420)
def test_a_stream_that_cannot_be_written_is_quarantined_and_the_others_land(device, spark_server, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    root = warehouse / "messages" / "importer=0"
    imp = Importer(device, spark_server.url, "--flush-interval", "0.5", warehouse=warehouse)
    try:
        imp.wait_ready(device)
        # A file where the stream's partition directory has to go: every write of it fails.
        day = datetime.datetime.now(datetime.timezone.utc).date()  # the Producer stamps messages now
        poison = Path(partition_dir(str(root), "poison-prod", day.isoformat())).parent
        poison.parent.mkdir(parents=True, exist_ok=True)
        poison.write_text("in the way")
        total = sent_rows(device, ["poison-prod", "good-prod", "fine-prod"], 5)
        df = table(spark_server, warehouse)
        wait_for(lambda: df.where(df.topic == "logs.test").count() >= total, timeout=240, interval=1,
                 what=f"{total} rows")
        assert where(spark_server, warehouse, "app_env IN ('good-prod', 'fine-prod')") == 10
        assert where(spark_server, warehouse, f"app_env = '{QUARANTINE}' AND original_app_env = 'poison-prod'") == 5
        assert imp.metric("logjam_importer_rows_quarantined_total") == 5
        status, doc = healthz(imp.metrics_port)
        assert status == 503 and doc["checks"]["quarantine"]["ok"] is False, doc
    finally:
        assert imp.stop() == 0, imp.output()
    out = imp.output()
    assert "quarantin" in out and "poison-prod" in out
    assert "path in the way" in out, out[-3000:]


@pytest.mark.timeout(420)
def test_writes_failing_for_every_stream_turn_healthz_unhealthy_and_land_once_mended(device, spark_server,
                                                                                      tmp_path) -> None:
    warehouse = tmp_path / "wh"
    staging = warehouse / "messages" / "_staging" / "importer=0"
    # --unhealthy-after 2: /healthz turns unhealthy after 2 s of failing writes instead of the default 10 s,
    # so the cause is mended while the writer's retries are seconds apart, not at their 10 s cap.
    imp = Importer(device, spark_server.url, "--flush-interval", "0.5", "--write-timeout", "30",
                   "--unhealthy-after", "2", warehouse=warehouse)
    try:
        imp.wait_ready(device)
        df = table(spark_server, warehouse)
        wait_for(lambda: df.where("app_env = 'probe-ready'").count() > 0, timeout=60, what="the probe rows")
        # Every write stages its batch there first: with a file in the way, nothing can be singled
        # out, so nothing is quarantined, and the writes are waited out.
        shutil.rmtree(staging)
        staging.write_text("in the way")
        names = ["one-prod", "two-prod"]
        total = sent_rows(device, names, 4)
        status, doc = wait_for(lambda: (r := healthz(imp.metrics_port))[0] == 503 and r, timeout=60,
                               what="/healthz to say the writes fail")
        assert "path in the way" in doc["checks"]["writes"]["detail"], doc
        staging.unlink()
        wait_for(lambda: df.where(df.topic == "logs.test").count() >= total, timeout=120, interval=0.25,
                 what="the rows once the path is free")
        assert df.where(df.topic == "logs.test").count() == total
        assert where(spark_server, warehouse, f"app_env = '{QUARANTINE}'") == 0
        wait_for(lambda: healthz(imp.metrics_port)[0] == 200, timeout=30, what="/healthz healthy again")
    finally:
        assert imp.stop() == 0, imp.output()


def test_directory_names_stay_within_the_limit() -> None:
    for name in NAMES:
        assert len(Path(partition_dir("/r", name, "2026-01-01")).parent.name.encode()) <= MAX_DIR_NAME


@pytest.mark.timeout(10)
def test_the_new_partition_budget_follows_what_a_burst_job_costs() -> None:
    from importer.plan import NEW_PARTITIONS_PER_JOB, NEW_PARTITIONS_RANGE, NewPartitionBudget

    budget = NewPartitionBudget(seconds=2.5)
    assert budget.allowed == NEW_PARTITIONS_PER_JOB
    budget.observe(NEW_PARTITIONS_PER_JOB // 2, 60.0)
    assert budget.allowed == NEW_PARTITIONS_PER_JOB, "a job that did not use its budget says nothing of a burst"
    seen = []
    for _ in range(12):  # a busy machine: 40 ms a partition plus 1 s a job
        budget.observe(budget.allowed, 1.0 + 0.04 * budget.allowed)
        seen.append(budget.allowed)
    assert seen[-1] == seen[-2] and 35 <= seen[-1] <= 40, seen  # (2.5 s - 1 s) / 40 ms = 37.5
    for _ in range(30):  # a quiet one: 2 ms a partition plus 0.5 s a job
        budget.observe(budget.allowed, 0.5 + 0.002 * budget.allowed)
    assert 950 <= budget.allowed <= 1050  # (2.5 s - 0.5 s) / 2 ms = 1000
    for _ in range(30):  # so fast that the bound holds it
        budget.observe(budget.allowed, 0.0005 * budget.allowed)
    assert budget.allowed == NEW_PARTITIONS_RANGE[1]
    for _ in range(30):  # a metastore that takes a second a partition
        budget.observe(budget.allowed, 1.0 * budget.allowed)
    assert budget.allowed == NEW_PARTITIONS_RANGE[0]


@pytest.mark.timeout(300)
def test_a_burst_of_new_streams_waits_in_the_spill_and_lands_once_across_a_restart(spark_server, tmp_path,
                                                                                   monkeypatch) -> None:
    from importer import plan
    from importer.decode import BatchBuilder
    from table.schema import ARROW_SCHEMA
    from importer.write import TableWriter
    from logjam.message import Message
    from tests.test_compaction import Table

    monkeypatch.setattr(plan, "NEW_PARTITIONS_PER_JOB", 10)
    monkeypatch.setattr(plan, "NEW_PARTITIONS_RANGE", (10, 10))
    t = Table(spark_server, tmp_path / "wh")
    spill = tmp_path / "spill"
    writer = TableWriter(t.database, 0, t.location, spill_dir=spill)

    def count() -> tuple[int, int]:
        row = t.spark.sql(f"SELECT count(*), count(DISTINCT seq) FROM {t.database}.messages").collect()[0]
        return int(row[0]), int(row[1])

    b = BatchBuilder()
    for seq in range(1, 101):  # 25 new streams, interleaved, 4 rows each
        b.add(Message.build(f"burst{seq % 25}-prod", "logs", {"message": f"m{seq}"}, seq=seq, device=5),
              time.time_ns() // 1000)  # created now, arrived now
    writer.write(t.spark, b.build())
    assert count() == (40, 40), "the first job took 10 new streams; the rest waits"
    assert writer.spill.rows == 60 and len(list(spill.glob("*.parquet"))) == 1
    # The next job takes a share; then the importer "dies" before the spill file is rewritten.
    empty = ARROW_SCHEMA.empty_table()
    commit = writer.plan(t.spark, empty)
    writer.target.append(t.spark, commit.rows, commit)  # the job, without marking its share of the spill done
    assert count() == (80, 80)
    restarted = TableWriter(t.database, 0, t.location, spill_dir=spill)
    while restarted.spill is None or not restarted._loaded or restarted.spill.files:
        restarted.write(t.spark, empty)
    assert count() == (100, 100), "every row once: the restart dropped what the table already held"
    assert not list(spill.glob("*.parquet"))


@pytest.mark.timeout(420)
@pytest.mark.parametrize("writes", [[], ["--no-staging"]], ids=["placed", "spark"])
def test_a_full_warehouse_disk_is_named_in_the_log_and_healthz_and_nothing_is_lost(device, spark_server,
                                                                                  tmp_path, writes) -> None:
    """Both ways rows reach the disk: files the importer places (importer/place.py), and Spark's job."""
    from tests.disk_support import fill, small_tmpfs

    with small_tmpfs(tmp_path / "disk", "64m") as disk:
        warehouse = disk / "wh"
        # --unhealthy-after 2: as in the failing-writes test above.
        imp = Importer(device, spark_server.url, "--flush-interval", "0.5", "--write-timeout", "30",
                       "--unhealthy-after", "2", *writes, warehouse=warehouse, state_dir=tmp_path / "state")
        try:
            imp.wait_ready(device)
            df = table(spark_server, warehouse)
            wait_for(lambda: df.where("app_env = 'probe-ready'").count() > 0, timeout=60, what="the probe rows")
            filler = fill(disk, 0)
            total = sent_rows(device, ["full-prod"], 200)
            status, doc = wait_for(lambda: (r := healthz(imp.metrics_port))[0] == 503 and r, timeout=60,
                                   what="/healthz to say the writes fail")
            assert "disk full" in doc["checks"]["writes"]["detail"], doc
            filler.unlink()
            wait_for(lambda: df.where("app_env = 'full-prod'").count() >= total, timeout=120, interval=0.25,
                     what="the rows once there is room")
            assert df.where("app_env = 'full-prod'").count() == total
        finally:
            assert imp.stop() == 0, imp.output()
    assert "disk full: " in imp.output()


@pytest.mark.timeout(300)
def test_a_job_with_spilled_rows_that_committed_as_its_client_died_leaves_none_of_them_in_the_spill(
        spark_server, tmp_path, monkeypatch) -> None:
    """The worker's retry finds the job landed (the commit made it, its reply did not): the share of
    the spill that job carried is done with, not taken again by the next job.

    Real Spark, the importer's BackgroundWriter and TableWriter; the commit's client is killed by
    stopping its Connect session as soon as the job that carried spilled rows committed. Before
    the fix the next job wrote that share again: 148 rows for 108."""
    from importer import plan
    from importer.batch import Batch
    from importer.commit import TableTarget
    from importer.decode import BatchBuilder
    from importer.write import BackgroundWriter, TableWriter
    from logjam.message import Message
    from table.session import open_session
    from tests.test_compaction import Table

    monkeypatch.setattr(plan, "NEW_PARTITIONS_PER_JOB", 10)
    monkeypatch.setattr(plan, "NEW_PARTITIONS_RANGE", (10, 10))
    t = Table(spark_server, tmp_path / "wh")
    spill = tmp_path / "spill"
    # The job's reply lost after its commit is a Spark job's hazard: the path that writes through Spark.
    table_writer = TableWriter(t.database, 0, t.location, staging=False, spill_dir=spill)
    killed: list[int] = []

    def write_then_die(self, spark, table) -> None:
        real_write(self, spark, table)
        if killed or not set(table.column("app_env").to_pylist()) & spilled_streams:
            return
        # Spark committed a job carrying spilled rows; its client dies before it hears so.
        killed.append(table.num_rows)
        spark.stop()
        spark.sql("SELECT 1").collect()
        raise ConnectionError("the commit's client was stopped")  # if the dead session did not raise itself

    real_write = TableTarget._write
    monkeypatch.setattr(TableTarget, "_write", write_then_die)
    spilled_streams: set[str] = set()
    seq = 0

    def batch(streams: list[str]) -> Batch:
        nonlocal seq
        b = BatchBuilder()
        for name in streams:
            seq += 1
            b.add(Message.build(name, "logs", {"message": f"m{seq}"}, seq=seq, device=5), 1_763_700_000_000_000)
        table = b.build()
        return Batch(table, None, table.num_rows, table.nbytes, 0.0)

    background = BackgroundWriter(lambda: open_session(spark_server.url, app_name="spill-kill"), table_writer,
                                  max_backoff=0.5)
    try:
        # 25 new streams, interleaved, 4 rows each: the first job registers 10, 60 rows wait in the spill.
        assert background.submit(batch([f"burst{i % 25}-prod" for i in range(1, 101)]))
        wait_for(lambda: background.idle, timeout=120, what="the first job")
        assert table_writer.spill.rows == 60
        spilled_streams.update(f"burst{i}-prod" for i in [0, *range(11, 25)])
        # Each next job carries a share of the spill; the first one that does commits as its client dies.
        for _ in range(2):
            assert background.submit(batch(["burst1-prod"] * 4))
            wait_for(lambda: background.idle, timeout=120, what="a job with a share of the spill")
        assert killed, "no job carried spilled rows"
        while table_writer.spill.files:  # whatever still waits goes with the next jobs
            assert background.submit(batch(["burst1-prod"]))
            wait_for(lambda: background.idle, timeout=120, what="the rest of the spill")
    finally:
        background.close(60)
        if background.spark is not None:
            background.spark.stop()
    rows = t.spark.sql(f"SELECT count(*), count(DISTINCT seq) FROM {t.database}.messages").collect()[0]
    assert (int(rows[0]), int(rows[1])) == (seq, seq), "every row once, spilled ones too"
    assert not list(spill.glob("*.parquet"))
