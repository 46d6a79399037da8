"""Event times from a broken clock or an old backlog, end to end: nothing acknowledged is lost to retention.

pylogbeat (the Lumberjack client from PyPI) sends events whose `@timestamp` is 10 days ago,
3 days ago, yesterday, now, 400 days ahead, the epoch, 1970-01-02, 9999-12-31, garbage and
absent, through a real logjam-bridge lumberjack, a real logjam-device and a real
logjam-importer started with `--retention-days 7` as `make up` starts it, into the session's
real Spark. Then the retention pass `make up` runs (7 days) goes over the table: every row
is still there, and no partition lies outside the window (7 days back, one ahead). A time
outside the window is filed under the day the row arrived, keeps its value in `created_at`
and is marked; its stream is counted in the importer's metrics and warned about. And the mark
column joins a table of the version before it as the earlier columns did.
"""

from __future__ import annotations

import datetime
import subprocess
import uuid

import pyarrow as pa
import pytest
from pylogbeat import PyLogBeatClient

from importer.decode import BatchBuilder
from importer.write import TableWriter
from table.catalog import ensure_table
from table.event_time import EventWindow
from table.schema import qualified
from harness.processes import command, wait_for
from tests.lumberjack_support import start_lumberjack
from tests.older_table import APP_ENV, compacted, older_table, write_as_before, yesterday
from tests.bridge_support import stop_bridge
from tests.spark_fixture import database_for
from tests.test_importer import Importer

PER_KIND = 20
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
RETENTION_DAYS = 7


def kinds(now: datetime.datetime) -> dict[str, object]:
    """`@timestamp` of each kind of event; `None`: the field is absent."""
    def iso(t: datetime.datetime) -> str:
        return t.isoformat().replace("+00:00", "Z")
    return {
        "tendays": iso(now - datetime.timedelta(days=10)),
        "threedays": iso(now - datetime.timedelta(days=3)),
        "yesterday": iso(now - datetime.timedelta(days=1)),
        "now": iso(now),
        "ahead": iso(now + datetime.timedelta(days=400)),
        "epoch": "1970-01-01T00:00:00Z",  # 0: no time at all, as absent
        "seventy": "1970-01-02T00:00:00Z",
        "maxyear": "9999-12-31T00:00:00Z",
        "garbage": "not a time",
        "absent": None,
    }


MOVED = {"tendays", "ahead", "seventy", "maxyear"}  # their own time picks no partition


@pytest.mark.timeout(300)
def test_event_times_outside_the_window_survive_retention_in_the_day_they_arrived(device, spark_server,
                                                                                   tmp_path) -> None:
    warehouse = tmp_path / "wh"
    run = uuid.uuid4().hex[:6]
    imp = Importer(device, spark_server.url, "--flush-interval", "0.5", "--retention-days", str(RETENTION_DAYS),
                   warehouse=warehouse)
    bridge = start_lumberjack(device.router, "--app-env-field", "service")
    try:
        imp.wait_ready(device)
        now = datetime.datetime.now(datetime.timezone.utc)
        stamps = kinds(now)
        client = PyLogBeatClient("127.0.0.1", bridge.port, ssl_enable=False)
        try:
            for kind, stamp in stamps.items():
                events = [{"message": f"{kind} {i}", "service": f"t{run}{kind}-prod",
                           **({} if stamp is None else {"@timestamp": stamp})} for i in range(PER_KIND)]
                client.send(events)  # returns once every event is acknowledged
        finally:
            client.close()

        database = database_for(warehouse)
        spark = spark_server.session()

        def rows() -> list:
            return spark.sql(
                f"SELECT app_env, CAST(date AS STRING) AS date, unix_micros(created_at) AS created, "
                f"CAST(to_date(ingested_at) AS STRING) AS arrived, created_out_of_window AS moved "
                f"FROM {database}.messages WHERE app_env LIKE 't{run}%'").collect()

        total = PER_KIND * len(stamps)
        wait_for(lambda: len(rows()) >= total, timeout=120, interval=0.5, what=f"{total} rows")

        done = subprocess.run([command("logjam-sql"), "--spark", spark_server.url, "--warehouse", str(warehouse),
                               "--database", database, "--retention-days", str(RETENTION_DAYS)],
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr + done.stdout

        landed = rows()
        assert len(landed) == total, "retention dropped acknowledged rows"
        by_kind: dict[str, list] = {}
        for r in landed:
            by_kind.setdefault(r.app_env.removeprefix(f"t{run}").removesuffix("-prod"), []).append(r)
        assert {k: len(v) for k, v in by_kind.items()} == {k: PER_KIND for k in stamps}
        for kind, got in by_kind.items():
            for r in got:
                own_day = (EPOCH + datetime.timedelta(microseconds=r.created)).date().isoformat()
                if kind in MOVED:
                    assert (r.date, r.moved) == (r.arrived, True), (kind, r)
                else:
                    assert (r.date, r.moved) == (own_day, None), (kind, r)
        # The moved rows keep their own time.
        assert {r.created for r in by_kind["maxyear"]} == {253_402_214_400_000_000}
        assert {r.created for r in by_kind["seventy"]} == {86_400_000_000}
        assert {r.created for r in by_kind["ahead"]} == {
            (now + datetime.timedelta(days=400) - EPOCH) // datetime.timedelta(milliseconds=1) * 1000}

        today = datetime.datetime.now(datetime.timezone.utc).date()
        oldest, newest = today - datetime.timedelta(days=RETENTION_DAYS), today + datetime.timedelta(days=1)
        parts = [r[0] for r in spark.sql(f"SHOW PARTITIONS {database}.messages").collect()]
        days = {p.rsplit("date=", 1)[1] for p in parts if f"app_env=t{run}" in p}
        assert days and all(oldest.isoformat() <= d <= newest.isoformat() for d in days), sorted(days)

        for kind in stamps:
            counted = imp.metric("logjam_importer_rows_out_of_window_total", app_env=f"t{run}{kind}-prod")
            assert counted == (PER_KIND if kind in MOVED else 0), (kind, counted)
    finally:
        stop_bridge(bridge)
        imp.stop()
    out = imp.output()
    for kind in MOVED:
        assert f"t{run}{kind}-prod: {PER_KIND} events with a time outside" in out, out[-3000:]


@pytest.mark.timeout(300)
def test_a_table_and_files_from_before_the_mark_read_null_and_compact(spark_server, tmp_path) -> None:
    """The version before `created_out_of_window`: its table gains the column on start, its files
    read NULL there, and compaction merges old and new files into one with the marks kept."""
    warehouse = tmp_path / "wh"
    spark = spark_server.session()
    database, location = older_table(spark, warehouse, ", `created_out_of_window` BOOLEAN")
    arrived_us, day = yesterday()

    def batch(first_seq: int, created_ms: list[int]) -> pa.Table:
        b = BatchBuilder(window=EventWindow(RETENTION_DAYS))
        for i, c in enumerate(created_ms):
            b.add_raw(APP_ENV, "logs", b'{"message":"m"}', 0, 3, c, first_seq + i, arrived_us)
        return b.build()

    write_as_before(spark, database, location,
                    batch(1, [arrived_us // 1000] * 2).drop_columns(["created_out_of_window"]), day)

    ensure_table(spark, database, location)  # as every importer and logjam-spark do on start
    assert "created_out_of_window" in spark.table(f"{database}.messages").columns
    TableWriter(database, 0, location).write(spark, batch(3, [arrived_us // 1000, 1000]))  # the second: 1970
    query = f"SELECT seq, created_out_of_window, CAST(date AS STRING) FROM {qualified(database)} ORDER BY seq"
    expected = [(1, None, day), (2, None, day), (3, None, day), (4, True, day)]
    assert [tuple(r) for r in spark.sql(query).collect()] == expected

    assert len(compacted(spark_server.url, database, location, day)) == 1
    assert [tuple(r) for r in spark.sql(query).collect()] == expected
