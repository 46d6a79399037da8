"""The `messages` table: its Arrow schema (what an importer writes) and Spark schema (what readers see).

docs/schema.md describes every column. Partition columns: `importer` (from the output
root, `importer=<I>`), then `app_env` and `date` (from `partitionBy`). Spark removes
partition columns from the Parquet files and appends them after the data columns when
reading, so the read schema has them last.
"""

from __future__ import annotations

import pyarrow as pa

PARTITION_COLUMNS = ("app_env", "date")

# Microseconds and UTC: that is what Spark's TimestampType is, so no conversion on the way in.
TIMESTAMP = pa.timestamp("us", tz="UTC")

ARROW_SCHEMA = pa.schema([
    pa.field("app_env", pa.string(), nullable=False),
    pa.field("app", pa.string()),
    pa.field("env", pa.string()),
    pa.field("topic", pa.string(), nullable=False),
    pa.field("device", pa.int64(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("created_at", TIMESTAMP, nullable=False),
    pa.field("ingested_at", TIMESTAMP, nullable=False),
    pa.field("body", pa.string()),
    pa.field("parse_error", pa.string()),
    pa.field("raw", pa.binary()),
    pa.field("message", pa.string()),
    pa.field("host", pa.string()),
    pa.field("severity", pa.int64()),
    pa.field("level", pa.string()),
    pa.field("action", pa.string()),
    pa.field("code", pa.int64()),
    pa.field("total_time", pa.float64()),
    pa.field("request_id", pa.string()),
    pa.field("protocol", pa.string()),
    pa.field("event_id", pa.string()),
    pa.field("date", pa.date32(), nullable=False),
])

COLUMNS: tuple[str, ...] = tuple(ARROW_SCHEMA.names)

# Spark DDL of the table as `spark.read.parquet("<warehouse>/messages")` presents it.
_SPARK_TYPES = {
    pa.string(): "STRING",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.binary(): "BINARY",
    TIMESTAMP: "TIMESTAMP",
    pa.date32(): "DATE",
}


def spark_read_ddl() -> str:
    """`col TYPE, ...` in the order Spark reads the table: data columns, then importer, app_env, date."""
    data = [f"`{f.name}` {_SPARK_TYPES[f.type]}" for f in ARROW_SCHEMA if f.name not in PARTITION_COLUMNS]
    return ", ".join(data + ["`importer` INT", "`app_env` STRING", "`date` DATE"])
