"""`trace_id` and `span_id` in the Delta table: an OTLP record's ids land in their columns, a row without them
reads NULL there, and both are in the log's per-file statistics that a lookup skips files by. Real Spark
(the session's logjam-spark) reading what delta-rs committed."""

from __future__ import annotations

import time

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from importer.decode import BatchBuilder
from table.catalog import ensure_table
from table.schema import qualified
from tests.spark_fixture import append_rows, database_for

APP_ENV = "otel-prod"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def batch(bodies: list[dict]) -> pa.Table:
    b = BatchBuilder()
    now_us = time.time_ns() // 1000
    for i, body in enumerate(bodies):
        b.add_raw(APP_ENV, "logs", orjson.dumps(body), 0, 3, now_us // 1000, i + 1, now_us)
    return b.build()


@pytest.mark.timeout(300)
def test_the_id_columns_read_back_and_have_statistics(spark_server, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    spark = spark_server.session()
    database = database_for(warehouse)
    location = warehouse / "messages"
    ensure_table(spark, database, str(location))
    otlp = {"message": "m", "severity_number": 13, "trace_id": TRACE, "span_id": SPAN}
    syslog = {"message": "m", "syslog": {"format": "rfc5424", "priority": 11, "facility": 1, "severity": 3}}
    append_rows(location, batch([otlp, {"message": "m"}, syslog]))

    query = f"SELECT seq, trace_id, span_id, level FROM {qualified(database)} ORDER BY seq"
    assert [tuple(r) for r in spark.sql(query).collect()] == [
        (1, TRACE, SPAN, "WARN"), (2, None, None, None), (3, None, None, "err")]
    (stats,) = pa.table(DeltaTable(str(location)).get_add_actions(flatten=True)).to_pylist()
    assert (stats["min.trace_id"], stats["max.trace_id"], stats["min.span_id"]) == (TRACE, TRACE, SPAN)
