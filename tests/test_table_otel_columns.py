"""`trace_id` and `span_id` join a table of the version before them, as the earlier columns did: the table
gains them when an importer or logjam-spark starts (`ensure_table`), the rows written before read NULL
there, new rows carry them, and compaction merges old and new files into one that keeps them. Real Spark
(the session's logjam-spark)."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from importer.decode import BatchBuilder
from importer.write import TableWriter
from table.catalog import ensure_table
from table.schema import qualified
from tests.older_table import APP_ENV, compacted, older_table, write_as_before, yesterday

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
NEW = ("trace_id", "span_id")


@pytest.mark.timeout(300)
def test_an_older_table_gains_the_id_columns_on_start_and_compaction_keeps_them(spark_server, tmp_path) -> None:
    warehouse = tmp_path / "wh"
    spark = spark_server.session()
    database, location = older_table(spark, warehouse, ", `trace_id` STRING, `span_id` STRING")
    arrived_us, day = yesterday()

    def batch(first_seq: int, bodies: list[dict]) -> pa.Table:
        b = BatchBuilder()
        for i, body in enumerate(bodies):
            b.add_raw(APP_ENV, "logs", orjson.dumps(body), 0, 3, arrived_us // 1000, first_seq + i, arrived_us)
        return b.build()

    otlp = {"message": "m", "severity_number": 13, "trace_id": TRACE, "span_id": SPAN}
    write_as_before(spark, database, location, batch(1, [otlp, {"message": "m"}]).drop_columns(list(NEW)), day)
    assert not set(NEW) & set(spark.table(f"{database}.messages").columns)

    ensure_table(spark, database, location)  # as every importer and logjam-spark do on start
    assert set(NEW) <= set(spark.table(f"{database}.messages").columns)
    syslog = {"message": "m", "syslog": {"format": "rfc5424", "priority": 11, "facility": 1, "severity": 3}}
    TableWriter(database, 0, location).write(spark, batch(3, [otlp, syslog]))
    query = f"SELECT seq, trace_id, span_id, level FROM {qualified(database)} ORDER BY seq"
    # Rows 1-2: files without the columns (their `level` came from this decoder, hence WARN).
    expected = [(1, None, None, "WARN"), (2, None, None, None), (3, TRACE, SPAN, "WARN"), (4, None, None, "err")]
    assert [tuple(r) for r in spark.sql(query).collect()] == expected

    (merged,) = compacted(spark_server.url, database, location, day)
    assert set(NEW) <= set(pq.read_schema(merged).names)
    assert [tuple(r) for r in spark.sql(query).collect()] == expected
