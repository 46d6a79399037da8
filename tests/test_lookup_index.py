"""The lookup index (table/lookup_index.py) on a real table of the session's logjam-spark: a hit is found, a
miss queries no indexed closed partition, and nothing (a late row, a merge, retention, a torn index, a kill
while the index is written) makes a row unfindable."""

from __future__ import annotations

import datetime
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from importer.decode import BatchBuilder
from importer.write import TableWriter
from logjam.message import Message
from runtime.durable import replace_file
from table import lookup_index
from table.catalog import ensure_table
from table.layout import Layout
from table.lookup_index import DayIndex, index_path, plan
from table.paths import partition_dir
from tests.spark_fixture import database_for
from tools import trace
from warehouse.config import MaintenanceConfig
from warehouse.maintenance import maintenance_pass

TODAY = datetime.datetime.now(datetime.timezone.utc).date()
DAYS = [TODAY - datetime.timedelta(days=2), TODAY - datetime.timedelta(days=1), TODAY]
STREAMS = ("web-prod", "api-prod", "jobs-prod")
COLUMNS = ("app_env", "date", "request_id", "trace_id", "event_id", "message")


class Month:
    """A small month: STREAMS x DAYS, rows with ids, written by the importer's writer and compacted."""

    def __init__(self, spark_server, warehouse: Path) -> None:
        self.spark = spark_server.session()
        self.database = database_for(warehouse)
        self.location = ensure_table(self.spark, self.database, str(warehouse / "messages"))
        self.table_dir = Path(self.location.removeprefix("file:"))
        self.writer = TableWriter(self.database, 0, self.location)
        self.seq = 0

    def land(self, rows: list[tuple[str, datetime.date, str]]) -> None:
        """(app_env, day, id) rows: the id as request id, trace id (hex) and event id, each marked by column."""
        b = BatchBuilder()
        for app_env, day, ident in rows:
            self.seq += 1
            at = int(datetime.datetime.combine(day, datetime.time(12), datetime.timezone.utc).timestamp() * 1000)
            body = {"message": f"m{self.seq}", "request_id": f"req-{ident}", "trace_id": ident.encode().hex(),
                    "@metadata": {"_id": f"ev-{ident}"}}
            b.add(Message.build(app_env, "logs", body, seq=self.seq, device=3, created_ms=at + self.seq), at * 1000)
        self.writer.write(self.spark, b.build())

    def fill(self, per: int = 20) -> None:
        self.land([(s, d, f"fill-{s}-{d}-{i}") for d in DAYS for s in STREAMS for i in range(per)])

    def maintain(self, layout: Layout = Layout()) -> None:
        done = maintenance_pass(self.spark, self.database, MaintenanceConfig(compact_grace=0), older_than=0,
                                layout=layout)
        assert not done.failed

    def find(self, column: str, value: str) -> list[dict]:
        return trace.lookup(self.spark, self.database, {column: [value]}, COLUMNS, location=self.location).rows

    def plan(self, column: str, value: str) -> lookup_index.LookupPlan:
        return plan(self.table_dir, {column: [value]})

    def pdir(self, app_env: str, day: datetime.date) -> Path:
        return Path(partition_dir(f"{self.table_dir}/importer=0", app_env, day.isoformat()))


def searched(p: lookup_index.LookupPlan) -> set[tuple[str, str]]:
    return {(x.app_env, x.date) for x in p.search}


def test_the_filter_holds_every_value_it_was_built_from() -> None:
    """No false negatives on any value (empty, long, non-ASCII), about 0.1% false positives."""
    rnd = random.Random(7)
    values = [f"{rnd.getrandbits(128):032x}" for _ in range(50_000)] + ["", "x" * 700, "ünïcode-id", "a'b\\c"]
    bits = lookup_index.build_filter([lookup_index.hashes("trace_id", pa.array(values))])
    for v in values[:500] + values[-4:]:
        assert lookup_index.may_hold(bits, int(lookup_index.hashes("trace_id", pa.array([v]))[0])), v
    others = lookup_index.hashes("trace_id", pa.array([f"{rnd.getrandbits(128):032x}" for _ in range(20_000)]))
    assert sum(lookup_index.may_hold(bits, int(h)) for h in others) / len(others) < 0.005
    # The column is part of the hash: a trace id is not taken for a request id.
    assert lookup_index.hashes("trace_id", pa.array(["x"]))[0] != lookup_index.hashes("request_id", pa.array(["x"]))[0]


@pytest.mark.timeout(600)
def test_a_hit_is_found_and_a_miss_queries_no_indexed_closed_partition(spark_server, tmp_path) -> None:
    m = Month(spark_server, tmp_path / "wh")
    m.fill()
    m.land([("api-prod", DAYS[0], "needle")])
    m.maintain()
    assert index_path(m.table_dir, DAYS[0].isoformat()).exists() and index_path(m.table_dir, DAYS[1].isoformat()).exists()
    assert not index_path(m.table_dir, TODAY.isoformat()).exists()  # the open day is never indexed

    today = {(s, TODAY.isoformat()) for s in STREAMS}
    for column, value in (("request_id", "req-needle"), ("trace_id", b"needle".hex()), ("event_id", "ev-needle")):
        p = m.plan(column, value)
        assert p.unindexed == len(STREAMS) and searched(p) >= today | {("api-prod", DAYS[0].isoformat())}
        assert len(p.search) <= len(STREAMS) + 2, searched(p)  # a false positive allowed, not a scan
        rows = m.find(column, value)
        assert [(r["app_env"], r["date"], r["event_id"]) for r in rows] == [("api-prod", DAYS[0], "ev-needle")]

    miss = m.plan("request_id", "req-nowhere")
    assert searched(miss) - today == set(), searched(miss)
    # Proof that a miss reads no indexed closed partition: their files are made unreadable (same names,
    # so the index still takes them for its own). The lookup answers; a plain query of the table fails.
    for s in STREAMS:
        for d in DAYS[:2]:
            for path in m.pdir(s, d).rglob("*.parquet"):
                path.write_bytes(b"garbage")
    assert m.find("request_id", "req-nowhere") == []
    with pytest.raises(Exception):
        m.spark.sql(f"SELECT count(*) FROM {m.database}.messages WHERE request_id = 'req-nowhere'").collect()


@pytest.mark.timeout(600)
def test_late_rows_merges_and_retention_never_hide_a_row(spark_server, tmp_path) -> None:
    m = Month(spark_server, tmp_path / "wh")
    old = TODAY - datetime.timedelta(days=9)
    m.fill(5)
    m.land([("web-prod", old, "ancient"), ("jobs-prod", old, "ancient-2")])
    m.maintain()
    assert m.plan("request_id", "req-late").unindexed == len(STREAMS)  # only today's are unindexed

    # A late row into an indexed closed day: that partition is stale, so searched, and the row found.
    m.land([("web-prod", DAYS[1], "late")])
    p = m.plan("request_id", "req-late")
    assert ("web-prod", DAYS[1].isoformat()) in searched(p) and p.unindexed == len(STREAMS) + 1
    assert [r["event_id"] for r in m.find("request_id", "req-late")] == ["ev-late"]

    # A merge the index has not seen (a pass without the index's refresh): still found.
    m.land([("web-prod", DAYS[1], "later")])
    m.maintain(Layout(for_lookups=False))
    assert m.plan("request_id", "req-late").unindexed == len(STREAMS) + 1
    assert [r["event_id"] for r in m.find("event_id", "ev-later")] == ["ev-later"]
    # The next pass indexes the merged day again: found through its filter now.
    m.maintain()
    p = m.plan("event_id", "ev-later")
    assert p.unindexed == len(STREAMS) and ("web-prod", DAYS[1].isoformat()) in searched(p)
    assert [r["event_id"] for r in m.find("event_id", "ev-later")] == ["ev-later"]
    assert [r["event_id"] for r in m.find("request_id", "req-late")] == ["ev-late"]

    # Retention takes the old day: its index file goes with the next pass, and every other row is still found.
    assert index_path(m.table_dir, old.isoformat()).exists()
    done = maintenance_pass(m.spark, m.database, MaintenanceConfig(retention_days=7, compact_grace=0), older_than=0)
    assert done.dropped == 2 and not index_path(m.table_dir, old.isoformat()).exists()
    assert m.find("request_id", "req-ancient") == []
    assert [r["event_id"] for r in m.find("request_id", "req-late")] == ["ev-late"]
    assert len(m.find("trace_id", f"fill-jobs-prod-{DAYS[0]}-3".encode().hex())) == 1


@pytest.mark.timeout(600)
def test_a_torn_or_garbage_index_is_ignored_with_a_warning(spark_server, tmp_path, caplog) -> None:
    m = Month(spark_server, tmp_path / "wh")
    m.fill(5)
    m.land([("jobs-prod", DAYS[1], "torn")])
    m.maintain()
    path = index_path(m.table_dir, DAYS[1].isoformat())
    whole = path.read_bytes()
    for broken in (whole[: len(whole) - 7], whole[:40], b"\0" * len(whole), os.urandom(len(whole)), b""):
        path.write_bytes(broken)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="table.lookup_index"):
            p = m.plan("request_id", "req-torn")
            rows = m.find("request_id", "req-torn")
        assert [r["event_id"] for r in rows] == ["ev-torn"]
        assert {(s, DAYS[1].isoformat()) for s in STREAMS} <= searched(p)  # the whole day is searched
        assert any("lookup index" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)
    m.maintain()  # the next pass writes it anew
    assert path.read_bytes() == whole and DayIndex(path).entries


CHILD = """
import sys
from pathlib import Path
from table import lookup_index
table_dir = Path(sys.argv[1])
print("ready", flush=True)
while True:
    lookup_index.refresh(table_dir, lambda date: date < sys.argv[2], force=True)
"""


@pytest.mark.timeout(600)
def test_a_kill_while_the_index_is_written_leaves_the_old_or_the_new(spark_server, tmp_path) -> None:
    m = Month(spark_server, tmp_path / "wh")
    m.fill(200)
    m.maintain()
    path = index_path(m.table_dir, DAYS[1].isoformat())
    before = path.read_bytes()
    m.land([("web-prod", DAYS[1], "new")])
    lookup_index.refresh(m.table_dir, lambda date: date < TODAY.isoformat())
    after = path.read_bytes()
    assert after != before
    rnd = random.Random(3)
    root = Path(__file__).resolve().parent.parent
    for attempt in range(8):
        replace_file(path, before)
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(m.table_dir), TODAY.isoformat()], cwd=root,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "ready"
            time.sleep(rnd.uniform(0, 0.3))
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait(timeout=30)
        assert path.read_bytes() in (before, after), f"attempt {attempt}: a torn index"
        assert DayIndex(path).entries
    assert [r["event_id"] for r in m.find("request_id", "req-new")] == ["ev-new"]
