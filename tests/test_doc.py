"""`doc`, the body as a VARIANT column of the Delta table, against a real `logjam-spark` with its JDBC endpoint.

Rows are committed as an importer commits them (delta-rs, tests/spark_fixture.py `append_rows`),
with `doc` encoded by the importer: by native/variant.c, or under LOGJAM_NATIVE=off by its
Python twin, importer/variant_py.py (marker `native`: each test runs under require and under
off, `native_mode`, each in a warehouse of its own, on the one JDBC server of the module, whose
JVM knows nothing of the switch). Checked: `doc` is the parsed body, NULL for a body that is not
a JSON object, and the same answers through Spark Connect, `logjam-sql` and JDBC (beeline) with
both `doc:path` and `variant_get`.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import orjson
import pytest

from logjam import native
from table.catalog import ensure_table
from importer.decode import BatchBuilder
from importer.variant import DocEncoder
from importer.variant_py import PyDocEncoder
from table.schema import qualified
from harness.processes import command, free_port
from tests.spark_fixture import SparkServer, append_rows, database_for, running_spark_server

pytestmark = pytest.mark.native

APP = "shop-prod"
CREATED_MS = 1_767_614_400_000  # 2026-01-05 12:00 UTC
INGESTED_US = 1_767_614_500_000_000


@pytest.fixture(scope="module")
def jdbc_server(tmp_path_factory) -> SparkServer:
    """A `logjam-spark` of this module's own, with HiveServer2 on: the session's server runs Connect alone."""
    with running_spark_server(Path(tmp_path_factory.mktemp("spark-jdbc")), jdbc=free_port(), timeout=180) as server:
        yield server


def beeline(server: SparkServer, query: str) -> list[list[str]]:
    """Rows of `query` through HiveServer2, with pyspark's own `beeline` (JDBC), tab-separated."""
    env = dict(os.environ, PATH=f"{Path(command('beeline')).parent}:{os.environ.get('PATH', '')}")
    res = subprocess.run([command("beeline"), "-u", f"jdbc:hive2://127.0.0.1:{server.jdbc}", "-n", "test",
                          "--silent=true", "--outputformat=tsv2", "--showHeader=false", "-e", query],
                         capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and "Error:" not in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    lines = [re.sub(r"^\d+: jdbc:hive2://\S+> ?", "", line) for line in res.stdout.splitlines()]
    return [line.split("\t") for line in lines if line.strip()]


def batch(bodies: list[bytes], first_seq: int = 1) -> object:
    b = BatchBuilder()
    for i, body in enumerate(bodies):
        b.add_raw(APP, "logs", body, 0, 3, CREATED_MS, first_seq + i, INGESTED_US)
    return b.build()


def request(i: int) -> bytes:
    return orjson.dumps({"message": f"GET /orders/{i}", "code": 200 + i % 2 * 300, "total_time": 1.5 * i,
                         "user": {"id": i, "account": {"plan": "pro" if i % 3 else "free"}}})


@pytest.mark.timeout(600)
def test_doc_is_the_parsed_body_queryable_every_way(jdbc_server, tmp_path, native_mode) -> None:
    spark = jdbc_server.session()
    warehouse = jdbc_server.warehouse / f"doc-{native_mode}"
    database = database_for(warehouse)
    location = warehouse / "messages"
    ensure_table(spark, database, str(location))
    assert isinstance(DocEncoder.load(), PyDocEncoder) == (native.mode() == "off")
    append_rows(location, batch([request(i) for i in range(1, 6)] + [b"plain text, not JSON", b' "a JSON string"'], 1))
    append_rows(location, batch([b" \n\t" + request(i) for i in range(6, 11)], 8))  # JSON may start with blanks
    t = qualified(database)

    rows = [tuple(r) for r in spark.sql(
        f"SELECT seq, doc:user.id::int, variant_get(doc, '$.user.account.plan', 'string'), doc IS NULL, "
        f"to_json(doc) FROM {t} ORDER BY seq").collect()]
    assert [r[0] for r in rows] == list(range(1, 13))
    assert rows[0] == (1, 1, "pro", False, '{"code":500,"message":"GET /orders/1","total_time":1.5,'
                                            '"user":{"account":{"plan":"pro"},"id":1}}')
    assert rows[2][2] == "free"
    assert rows[5][1:4] == (None, None, True)  # not JSON: NULL, with the text still in `body`
    # JSON, but not an object: NULL too (one such value would keep Spark from shredding the whole file)
    assert rows[6][1:] == (None, None, True, None)
    assert [r[1] for r in rows[7:]] == [6, 7, 8, 9, 10]
    errors = spark.sql(f"SELECT sum(doc:total_time::double) FROM {t} WHERE doc:code::int >= 500").collect()[0][0]
    assert errors == 1.5 * (1 + 3 + 5 + 7 + 9)

    jdbc = beeline(jdbc_server, f"SELECT seq, doc:user.id::int, variant_get(doc, '$.user.id', 'int'), "
                                f"to_json(doc:user) FROM {t} WHERE doc:code::int >= 500 ORDER BY seq")
    seqs = {1: 1, 3: 3, 5: 5, 7: 9, 9: 11}
    assert jdbc == [[str(seqs[i]), str(i), str(i), orjson.dumps({"account": {"plan": "pro" if i % 3 else "free"},
                                                                 "id": i}).decode()] for i in seqs]

    out = subprocess.run([command("logjam-sql"), "--spark", jdbc_server.url, "--database", database,
                          "--warehouse", str(warehouse), "--json",
                          "SELECT seq, doc:user AS user, doc FROM messages WHERE doc:user.id::int = 2 OR seq = 6"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [orjson.loads(line) for line in out.stdout.splitlines()]
    assert sorted(lines, key=lambda r: r["seq"]) == [
        {"seq": 2, "user": {"account": {"plan": "pro"}, "id": 2}, "doc": orjson.loads(request(2))},
        {"seq": 6, "user": None, "doc": None}]
