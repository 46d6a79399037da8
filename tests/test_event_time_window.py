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
