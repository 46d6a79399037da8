"""`trace_id` and `span_id` join a table of the version before them, as the earlier columns did: the table
gains them when an importer or logjam-spark starts (`ensure_table`), the rows written before read NULL
there, new rows carry them, and compaction merges old and new files into one that keeps them. Real Spark
(the session's logjam-spark)."""

from __future__ import annotations

import datetime
import subprocess
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from importer.decode import BatchBuilder
from importer.write import TableWriter
from table.catalog import ensure_table
from table.paths import partition_dir
from table.protocol import live_files, read_marker
from table.schema import PARTITION_COLUMNS, WRITE_OPTIONS, partition_clause, qualified, table_ddl, with_doc
from harness.processes import command
from tests.spark_fixture import database_for

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
NEW = ("trace_id", "span_id")


@pytest.mark.timeout(300)
def test_an_older_table_gains_the_id_columns_on_start_and_compaction_keeps_them(spark_server, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    spark = spark_server.session()
    database = database_for(warehouse)
    location = str(warehouse / "messages")
    old_ddl = table_ddl(database, location).replace(", `trace_id` STRING, `span_id` STRING", "")
    assert "trace_id" not in old_ddl and "span_id" not in old_ddl
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    spark.sql(old_ddl)
    arrived_us = time.time_ns() // 1000 - 86_400_000_000  # yesterday: a closed day, which compaction merges
    day = (EPOCH + datetime.timedelta(microseconds=arrived_us)).date().isoformat()

    def batch(first_seq: int, bodies: list[dict]) -> pa.Table:
        b = BatchBuilder()
        for i, body in enumerate(bodies):
            b.add_raw("old-prod", "logs", orjson.dumps(body), 0, 3, arrived_us // 1000, first_seq + i, arrived_us)
        return b.build()

    otlp = {"message": "m", "severity_number": 13, "trace_id": TRACE, "span_id": SPAN}
    root = f"{location}/importer=0"
    before = batch(1, [otlp, {"message": "m"}]).drop_columns(list(NEW))  # as the old version wrote them
    with_doc(spark.createDataFrame(before)).write.options(**WRITE_OPTIONS).mode("append") \
        .partitionBy(*PARTITION_COLUMNS).parquet(root)
    spark.sql(f"ALTER TABLE {qualified(database)} ADD {partition_clause(0, 'old-prod', day)} "
              f"LOCATION '{partition_dir(root, 'old-prod', day)}'")
    assert not set(NEW) & set(spark.table(f"{database}.messages").columns)

    ensure_table(spark, database, location)  # as every importer and logjam-spark do on start
    assert set(NEW) <= set(spark.table(f"{database}.messages").columns)
    syslog = {"message": "m", "syslog": {"format": "rfc5424", "priority": 11, "facility": 1, "severity": 3}}
    TableWriter(database, 0, location).write(spark, batch(3, [otlp, syslog]))
    query = f"SELECT seq, trace_id, span_id, level FROM {qualified(database)} ORDER BY seq"
    # Rows 1-2: files without the columns (their `level` came from this decoder, hence WARN).
    expected = [(1, None, None, "WARN"), (2, None, None, None), (3, TRACE, SPAN, "WARN"), (4, None, None, "err")]
    assert [tuple(r) for r in spark.sql(query).collect()] == expected

    done = subprocess.run([command("logjam-sql"), "--spark", spark_server.url, "--warehouse", str(warehouse),
                           "--database", database, "--compact", "--older-than", "0", "--compact-grace", "0"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr + done.stdout
    pdir = Path(partition_dir(str(warehouse / "messages" / "importer=0"), "old-prod", day))
    marker = read_marker(pdir)
    assert marker is not None and marker.state == "done", done.stdout
    (merged,) = live_files(pdir)
    assert set(NEW) <= set(pq.read_schema(merged).names)
    assert [tuple(r) for r in spark.sql(query).collect()] == expected
