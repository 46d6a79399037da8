"""`logjam-sql --trace ID` as a script and a person read it, against the session's real Spark Connect
server: into a pipe every timeline line is whole, on a terminal (a pty) it is cut, and `--json` gives
one JSON object per row."""

from __future__ import annotations

import datetime
import os
import pty
import subprocess
import threading
import time
import uuid

import orjson
import pytest

from harness.processes import command
from importer.decode import BatchBuilder
from logjam.message import Message
from table.catalog import ensure_table
from tests.spark_fixture import append_rows, database_for

pytestmark = pytest.mark.timeout(300)

# Far past any width a timeline line is cut to on a terminal (100 characters by default).
LONG = "charge card " + " ".join(f"step-{k:03d}" for k in range(60)) + " done"


@pytest.fixture
def traced(spark_server, tmp_path) -> tuple[list[str], str]:
    """Two rows of one request id, one with a long message, in a warehouse of the test's own: the
    logjam-sql arguments that show them, and the id."""
    warehouse = tmp_path / "wh"
    database = database_for(warehouse)
    request = f"req-{uuid.uuid4().hex[:8]}"
    now = datetime.datetime.now(datetime.timezone.utc)
    b = BatchBuilder()
    for seq, (app_env, ago, message) in enumerate([("web-prod", 3, "GET /checkout"), ("payments-prod", 1, LONG)], 1):
        at = int((now - datetime.timedelta(seconds=ago)).timestamp() * 1000)
        b.add(Message.build(app_env, "logs.trace", {"message": message, "request_id": request, "level": "info"},
                            seq=seq, device=5, created_ms=at), time.time_ns() // 1000)
    ensure_table(spark_server.session(), database, str(warehouse / "messages"))
    append_rows(warehouse / "messages", b.build())
    args = [command("logjam-sql"), "--trace", request, "--spark", spark_server.url, "--warehouse", str(warehouse),
            "--database", database]
    return args, request


def test_into_a_pipe_every_line_is_whole(traced) -> None:
    args, request = traced
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    head, *lines = r.stdout.splitlines()
    assert head.startswith(f"{request}: 2 rows from 2 streams"), r.stdout
    assert len(lines) == 2 and "GET /checkout" in lines[0], lines
    assert lines[1].endswith(f" {LONG}") and "…" not in r.stdout, lines[1]


def test_on_a_terminal_a_long_line_is_cut(traced) -> None:
    """The same command with its stdout a pty, as a person's terminal is: the long row is cut."""
    args, _ = traced
    leader, follower = pty.openpty()
    got = bytearray()

    def read() -> None:  # while it runs: a pty's buffer is small, and a full one would stop the writer
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the last writer closed its end
                return
            if not chunk:
                return
            got.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE)
        os.close(follower)
        follower = -1
        _, err = proc.communicate(timeout=120)
        reader.join(10)
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    lines = [line for line in got.decode(errors="replace").replace("\r\n", "\n").split("\n") if line]
    row = next((line for line in lines if "payments-prod" in line), None)
    assert row is not None, lines
    assert row.endswith("…") and len(row) == 100 and LONG not in row, row


def test_json_gives_one_object_per_row(traced) -> None:
    args, request = traced
    r = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [orjson.loads(line) for line in r.stdout.splitlines()]
    assert [(g["app_env"], g["message"], g["request_id"]) for g in rows] == [
        ("web-prod", "GET /checkout", request), ("payments-prod", LONG, request)]
    first, second = (datetime.datetime.fromisoformat(g["created_at"]) for g in rows)
    assert first < second  # oldest first, times in ISO 8601
    assert f"{request}: 2 rows from 2 streams" in r.stderr  # the header, kept out of the JSON
