"""logjam-sql against the session's real Spark Connect server."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import orjson
import pytest

from table.catalog import ensure_table
from importer.decode import BatchBuilder
from logjam.message import Message
from harness.processes import command, free_port
from tests.spark_fixture import append_rows, database_for


def sql(spark_server, query: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([command("logjam-sql"), query, "--spark", spark_server.url, *extra],
                          capture_output=True, text=True, timeout=120)


def land(spark_server, warehouse: Path, counts: dict[str, int], database: str | None = None, device: int = 5) -> None:
    """Commit rows to the test's Delta table as an importer does, and name it in the server's catalog."""
    b = BatchBuilder()
    for app_env, n in counts.items():
        for i in range(n):
            b.add(Message.build(app_env, "logs.sql", {"message": f"m{i}", "@metadata": {"protocol": "segment"}},
                                seq=i + 1, device=device), time.time_ns() // 1000)  # created now, arrived now
    database = database or database_for(warehouse)
    ensure_table(spark_server.session(), database, str(warehouse / "messages"))
    append_rows(warehouse / "messages", b.build())


@pytest.mark.timeout(240)
def test_query_prints_a_table_and_json_lines(spark_server, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    land(spark_server, warehouse, {"sqla-prod": 3})
    land(spark_server, warehouse, {"sqlb-dev": 2}, device=6)
    q = "SELECT app_env, count(*) AS n, first(protocol) AS protocol FROM messages GROUP BY 1 ORDER BY 1"

    db = ["--warehouse", str(warehouse), "--database", database_for(warehouse)]
    r = sql(spark_server, q, *db, "--json")
    assert r.returncode == 0, r.stderr
    assert [orjson.loads(line) for line in r.stdout.splitlines()] == [
        {"app_env": "sqla-prod", "n": 3, "protocol": "segment"},
        {"app_env": "sqlb-dev", "n": 2, "protocol": "segment"},
    ]

    r = sql(spark_server, q, *db)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split("|")[1:4] == [" app_env   ", " n ", " protocol "]
    assert "| sqla-prod | 3 | segment  |" in lines
    assert lines[-1] == "(2 rows)"


@pytest.mark.timeout(240)
def test_default_warehouse_is_the_servers(spark_server) -> None:
    land(spark_server, spark_server.warehouse, {"sqldefault-prod": 4}, database="logjam")
    r = sql(spark_server, "SELECT count(*) AS n FROM messages WHERE app_env = 'sqldefault-prod'", "--json")
    assert r.returncode == 0, r.stderr
    assert orjson.loads(r.stdout) == {"n": 4}


@pytest.mark.timeout(240)
def test_empty_warehouse_and_bad_query(spark_server, tmp_path) -> None:
    db = ["--warehouse", str(tmp_path / "none"), "--database", database_for(tmp_path / "none")]
    before = len(spark_server.output())
    r = sql(spark_server, "SELECT app_env, count(*) FROM messages GROUP BY 1", *db, "--json")
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    # Creating a database and an empty table is expected: the server logs it without stack traces.
    r = sql(spark_server, "SELECT count(*) FROM messages", *db, "--json")
    assert r.returncode == 0, r.stderr
    assert "\tat org." not in spark_server.output()[before:], spark_server.output()[before:][-3000:]
    r = sql(spark_server, "SELECT no_such_column FROM messages", *db)
    assert r.returncode == 1
    assert "UNRESOLVED_COLUMN" in r.stderr and "JVM stacktrace" not in r.stderr


@pytest.mark.timeout(60)
def test_no_server_is_said_at_once() -> None:
    # pyspark's client retries a refused connection for about a minute a call, twice (the query,
    # then the session's release): logjam-sql tried the port first and says so.
    port = free_port()
    t = time.monotonic()
    r = subprocess.run([command("logjam-sql"), "SELECT 1", "--spark", f"sc://127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=50)
    assert time.monotonic() - t < 20
    assert r.returncode == 1 and r.stdout == ""
    assert f"no Spark Connect server answers at 127.0.0.1:{port}: Connection refused" in r.stderr, r.stderr


@pytest.mark.timeout(300)
def test_a_master_url_runs_a_classic_session_over_the_same_files(spark_server, tmp_path) -> None:
    """`--spark local[1]` (offered by --help) starts its own session, which names the Delta table on disk in its
    own catalog and reads it as the server does."""
    warehouse = tmp_path / "wh"
    land(spark_server, warehouse, {"sqlclassic-prod": 5})
    r = subprocess.run([command("logjam-sql"), "SELECT app_env, count(*) AS n FROM messages GROUP BY 1", "--json",
                        "--spark", "local[1]", "--warehouse", str(warehouse)],
                       capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [orjson.loads(line) for line in r.stdout.splitlines()] == [{"app_env": "sqlclassic-prod", "n": 5}]


@pytest.mark.timeout(240)
def test_trace_prints_one_request_across_streams_and_days_in_time_order(spark_server, tmp_path) -> None:
    """`--trace ID`: the rows of a request id or a trace id (matched lowercased), from every stream, oldest
    first, with how many days were searched; `--days` narrows the search, `--json` gives the rows."""
    import datetime

    warehouse = tmp_path / "wh"
    database = database_for(warehouse)
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    trace = "4BF92F3577B34DA6A3CE929D0E0E4736"
    rows = [  # (app_env, seconds before now, body): out of time order on purpose
        ("payments-prod", 30, {"message": "charge card", "trace_id": trace.lower(), "level": "info"}),
        ("web-prod", 86_400 + 60, {"message": "GET /checkout", "request_id": "req-42", "level": "info"}),
        ("orders-prod", 45, {"message": "order stored", "traceId": trace, "level": "warn"}),
        ("web-prod", 40, {"message": "another request", "request_id": "req-43"}),
        ("orders-prod", 20, {"message": "no id at all"}),
    ]
    b = BatchBuilder()
    for seq, (app_env, ago, body) in enumerate(rows, 1):
        at = int((now - datetime.timedelta(seconds=ago)).timestamp() * 1000)
        b.add(Message.build(app_env, "logs.trace", body, seq=seq, device=5, created_ms=at), time.time_ns() // 1000)
    ensure_table(spark_server.session(), database, str(warehouse / "messages"))
    append_rows(warehouse / "messages", b.build())

    def trace_of(ident: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([command("logjam-sql"), "--trace", ident, "--spark", spark_server.url, "--warehouse",
                               str(warehouse), "--database", database, *extra],
                              capture_output=True, text=True, timeout=120)

    r = trace_of(trace)
    assert r.returncode == 0, r.stderr
    head, *lines = r.stdout.splitlines()
    assert head.startswith(f"{trace}: 2 rows from 2 streams, searched 2 days (")
    assert ["orders-prod" in lines[0], "payments-prod" in lines[1]] == [True, True], lines
    assert "order stored" in lines[0] and "+    0.000s" in lines[0] and "+   15.000s" in lines[1]

    r = trace_of("req-42")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("req-42: 1 row from 1 stream, searched 2 days")
    r = trace_of("req-42", "--days", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["req-42: 0 rows from 0 streams, searched 1 day "
                                     f"({now.date()} .. {now.date()})"]

    r = trace_of(trace, "--json")
    assert r.returncode == 0, r.stderr
    got = [orjson.loads(line) for line in r.stdout.splitlines()]
    assert [(g["app_env"], g["message"], g["trace_id"]) for g in got] == [
        ("orders-prod", "order stored", trace.lower()), ("payments-prod", "charge card", trace.lower())]
    assert "2 rows from 2 streams" in r.stderr

    r = subprocess.run([command("logjam-sql"), "SELECT 1", "--trace", "x"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not both" in r.stderr
