"""The lookup index (table/lookup_index.py, table/lookup_plan.py) on a real table of the session's logjam-spark:
a hit is found in any day's files, only the candidate files are read, and nothing (a late file, a merge, a
swap, retention, a torn marker or index, a kill while the index is written) makes a row unfindable."""

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

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from importer.decode import BatchBuilder
from importer.write import TableWriter
from logjam.message import Message
from runtime.durable import replace_file
from table import lookup_index
from table.catalog import ensure_table
from table.layout import Layout
from table import lookup_plan
from table.lookup_index import DayIndex, index_path
from table.lookup_plan import plan
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

    def plan(self, column: str, value: str) -> lookup_plan.LookupPlan:
        return plan(self.table_dir, {column: [value]})

    def read(self, p: lookup_plan.LookupPlan, event_id: str) -> list[dict]:
        """What tools/trace.py's lookup reads for `event_id` with the plan `p` (made earlier)."""
        return trace._read(self.spark, f"{self.database}.messages", p, {"event_id": [event_id]}, COLUMNS)

    def pdir(self, app_env: str, day: datetime.date) -> Path:
        return Path(partition_dir(f"{self.table_dir}/importer=0", app_env, day.isoformat()))


def searched(p: lookup_plan.LookupPlan) -> set[tuple[str, str]]:
    return {(x.part.app_env, x.part.date) for x in p.search}


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


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=300), st.integers(0, 4))
def test_distinct_is_numpys_unique(values: list[int], repeat: int) -> None:
    """The index's own distinct (a sort and a comparison, as numpy 2.4's unique is slow) is np.unique's answer."""
    h = np.array(values * (repeat + 1), dtype=np.uint64)
    got = lookup_index.distinct(h)
    assert got.dtype == np.uint64 and np.array_equal(got, np.unique(h))


def garble(paths: list[Path]) -> None:
    """Make files unreadable as Parquet, keeping their size and mtime (so the index still takes them for its
    own: files are never rewritten in place, and the index does not read them to check)."""
    for path in paths:
        st = path.stat()
        path.write_bytes(b"garbage!" * (st.st_size // 8) + b"!" * (st.st_size % 8))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.timeout(600)
def test_a_hit_per_column_in_any_day_and_only_candidate_files_are_read(spark_server, tmp_path) -> None:
    m = Month(spark_server, tmp_path / "wh")
    m.fill()
    m.land([("api-prod", DAYS[0], "needle")])
    m.maintain()
    # The open day gets files all day: three more batches, each a file of web-prod's open partition, one a needle.
    for i in range(3):
        m.land([("web-prod", TODAY, f"today-{i}-{j}") for j in range(20)] + ([("web-prod", TODAY, "fresh")] if i == 1 else []))
    done = lookup_index.refresh(m.table_dir)
    assert done.days == 1 and done.built == 3, done  # only the open day's three new files hashed
    assert lookup_index.refresh(m.table_dir).days == 0  # nothing new: nothing rewritten
    for day in DAYS:
        assert index_path(m.table_dir, day.isoformat()).exists()  # every day, the open one too

    for ident, where in (("needle", ("api-prod", DAYS[0].isoformat())), ("fresh", ("web-prod", TODAY.isoformat()))):
        for column, value in (("request_id", f"req-{ident}"), ("trace_id", ident.encode().hex()),
                              ("event_id", f"ev-{ident}")):
            p = m.plan(column, value)
            assert p.unindexed == 0 and where in searched(p) and len(p.search) <= 2, searched(p)
            hit = next(s for s in p.search if (s.part.app_env, s.part.date) == where)
            assert hit.files is not None and len(hit.files) <= 2  # one file, a false positive allowed
            rows = m.find(column, value)
            assert [(r["app_env"], r["date"].isoformat(), r["event_id"]) for r in rows] == [(*where, f"ev-{ident}")]

    # Proof that only the candidate files are read: every other data file of the table is made unreadable
    # (same names, sizes and mtimes). A plain query fails; the lookups still answer, the miss reads nothing.
    plans = (m.plan("event_id", "ev-fresh"), m.plan("request_id", "req-nowhere"))  # (its false positives kept)
    keep = {(s.part.dir, f) for p in plans for s in p.search for f in s.files or ()}
    garble([f for d in DAYS for s in STREAMS for f in m.pdir(s, d).rglob("*.parquet")
            if (m.pdir(s, d), f.name) not in keep])
    assert [r["event_id"] for r in m.find("event_id", "ev-fresh")] == ["ev-fresh"]
    assert m.find("request_id", "req-nowhere") == []
    with pytest.raises(Exception):
        m.spark.sql(f"SELECT count(*) FROM {m.database}.messages WHERE request_id = 'req-nowhere'").collect()


@pytest.mark.timeout(600)
def test_files_the_index_has_not_seen_are_searched(spark_server, tmp_path) -> None:
    """A file placed after the refresh, a merge's output not yet indexed, a swap under way, a torn marker."""
    m = Month(spark_server, tmp_path / "wh")
    m.fill(5)
    m.maintain()
    assert m.plan("request_id", "req-late").unindexed == 0
    # Late files into the open day and into a closed day: searched as unindexed files, found.
    m.land([("web-prod", TODAY, "late"), ("jobs-prod", DAYS[1], "late-closed")])
    p = m.plan("request_id", "req-late")
    assert p.unindexed == 2 and searched(p) >= {("web-prod", TODAY.isoformat()), ("jobs-prod", DAYS[1].isoformat())}
    assert [r["event_id"] for r in m.find("request_id", "req-late")] == ["ev-late"]
    assert [r["event_id"] for r in m.find("trace_id", b"late-closed".hex())] == ["ev-late-closed"]

    # A merge the index has not seen (a pass without the index's refresh): its new file is searched.
    m.land([("web-prod", DAYS[1], "later")])
    before = m.plan("event_id", "ev-later")
    m.maintain(Layout(for_lookups=False))
    assert m.plan("event_id", "ev-later").unindexed >= 1
    assert [r["event_id"] for r in m.find("event_id", "ev-later")] == ["ev-later"]
    # The plan made before that merge named files the swap replaced. They stay readable for their grace
    # (none here: compact_grace=0), and a read of a deleted one fails, never answers short (`lookup` then
    # plans again).
    replaced = [part.dir / rel for rel, part in lookup_plan.named_files(before).values()
                if rel not in (lookup_index.live_files(part.dir) or {})]
    assert any(p.parent == m.pdir("web-prod", DAYS[1]) for p in replaced)  # the merged partition's old files
    with pytest.raises(Exception, match="PATH_NOT_FOUND|FILE_NOT_EXIST|FileNotFound"):
        m.read(before, "ev-later")
    # The next pass indexes the merged files: found through their filters, nothing unindexed.
    m.maintain()
    p = m.plan("event_id", "ev-later")
    assert p.unindexed == 0 and ("web-prod", DAYS[1].isoformat()) in searched(p)
    assert [r["event_id"] for r in m.find("event_id", "ev-later")] == ["ev-later"]

    # A swap under way, a torn marker: the partition's live files are not known, so it is searched whole.
    pdir = m.pdir("web-prod", DAYS[1])
    marker = (pdir / "_compaction.json").read_bytes()  # merged above
    for broken in (marker.replace(b'"done"', b'"swapping"'), marker[: len(marker) // 2]):
        (pdir / "_compaction.json").write_bytes(broken)
        p = m.plan("request_id", "req-late")
        assert any(s.files is None and s.part.dir == pdir for s in p.search)
        assert [r["event_id"] for r in m.find("request_id", f"req-fill-web-prod-{DAYS[1]}-2")] == [
            f"ev-fill-web-prod-{DAYS[1]}-2"]
    (pdir / "_compaction.json").write_bytes(marker)


@pytest.mark.timeout(600)
def test_retention_removes_a_days_index(spark_server, tmp_path) -> None:
    m = Month(spark_server, tmp_path / "wh")
    old = TODAY - datetime.timedelta(days=9)
    m.fill(5)
    m.land([("web-prod", old, "ancient"), ("jobs-prod", old, "ancient-2")])
    m.maintain()
    assert index_path(m.table_dir, old.isoformat()).exists()
    done = maintenance_pass(m.spark, m.database, MaintenanceConfig(retention_days=7, compact_grace=0), older_than=0)
    assert done.dropped == 2 and not index_path(m.table_dir, old.isoformat()).exists()
    assert m.find("request_id", "req-ancient") == []
    assert len(m.find("trace_id", f"fill-jobs-prod-{DAYS[0]}-3".encode().hex())) == 1


@pytest.mark.timeout(600)
def test_a_torn_or_garbage_index_is_ignored_with_a_warning(spark_server, tmp_path, caplog) -> None:
    m = Month(spark_server, tmp_path / "wh")
    m.fill(5)
    m.land([("jobs-prod", DAYS[1], "torn")])
    m.maintain()
    path = index_path(m.table_dir, DAYS[1].isoformat())
    whole = path.read_bytes()
    for broken in (whole[: len(whole) - 7], whole[:40], b"\0" * len(whole), os.urandom(len(whole)), b"",
                   whole.replace(b"LJLKIDX2", b"LJLKIDX1")):
        path.write_bytes(broken)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="table.lookup_index"):
            p = m.plan("request_id", "req-torn")
            rows = m.find("request_id", "req-torn")
        assert [r["event_id"] for r in rows] == ["ev-torn"]
        day = [s for s in p.search if s.part.date == DAYS[1].isoformat()]
        assert len(day) == len(STREAMS) and all(s.files is None for s in day)  # the whole day is searched
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
    lookup_index.refresh(table_dir, force=True)
"""


@pytest.mark.timeout(600)
def test_a_kill_while_the_index_is_written_leaves_the_old_or_the_new(spark_server, tmp_path) -> None:
    m = Month(spark_server, tmp_path / "wh")
    m.fill(200)
    m.maintain()
    path = index_path(m.table_dir, DAYS[1].isoformat())
    before = path.read_bytes()
    m.land([("web-prod", DAYS[1], "new")])
    lookup_index.refresh(m.table_dir)
    after = path.read_bytes()
    assert after != before
    rnd = random.Random(3)
    root = Path(__file__).resolve().parent.parent
    for attempt in range(8):
        replace_file(path, before)
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(m.table_dir)], cwd=root,
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
