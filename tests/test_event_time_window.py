"""Event times from a broken clock or an old backlog, end to end: nothing acknowledged is lost to retention.

pylogbeat (the Lumberjack client from PyPI) sends events whose `@timestamp` is 10 days ago,
3 days ago, yesterday, now, 400 days ahead, the epoch, 1970-01-02, 9999-12-31, garbage and
absent, through a real logjam-bridge lumberjack, a real logjam-device and a real
logjam-importer started with `--retention-days 7` as `make up` starts it, into a Delta table.
Then the retention pass `make up` runs (7 days) goes over the table: every row
is still there, and no partition lies outside the window (7 days back, one ahead). A time
outside the window is filed under the day the row arrived, keeps its value in `created_at`
and is marked; its stream is counted in the importer's metrics and warned about.
"""

from __future__ import annotations

import datetime
import subprocess
import uuid
from types import SimpleNamespace

import pytest
from deltalake import DeltaTable
from pylogbeat import PyLogBeatClient

from harness.processes import command, wait_for
from tests import table_support
from tests.lumberjack_support import start_lumberjack
from tests.bridge_support import stop_bridge
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
def test_event_times_outside_the_window_survive_retention_in_the_day_they_arrived(device, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    run = uuid.uuid4().hex[:6]
    imp = Importer(device, "--flush-interval", "0.5", "--retention-days", str(RETENTION_DAYS),
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

        def rows() -> list:
            return [SimpleNamespace(app_env=r.app_env, date=r.date.isoformat(), moved=r.created_out_of_window,
                                    created=(r.created_at - EPOCH) // datetime.timedelta(microseconds=1),
                                    arrived=r.ingested_at.date().isoformat())
                    for r in table_support.rows(warehouse, columns=["app_env", "date", "created_at", "ingested_at",
                                                                    "created_out_of_window"])
                    if r.app_env.startswith(f"t{run}")]

        total = PER_KIND * len(stamps)
        wait_for(lambda: len(rows()) >= total, timeout=120, interval=0.5, what=f"{total} rows")

        done = subprocess.run([command("logjam-sql"), "--warehouse", str(warehouse),
                               "--retention-days", str(RETENTION_DAYS)],
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
        parts = DeltaTable(str(warehouse / "messages")).partitions()
        days = {p["date"] for p in parts if p["app_env"].startswith(f"t{run}")}
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
