"""The `messages` table's columns: its Arrow schema (an importer's decoded rows), `doc`, and SQL naming.

docs/schema.md describes every column. The Delta table (table/delta.py) is partitioned by
`app_env` and `date`; its columns are ARROW_SCHEMA's in their order, then `doc`.
"""

from __future__ import annotations

import pyarrow as pa

DEFAULT_DATABASE = "logjam"
TABLE_NAME = "messages"
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
    pa.field("journal", pa.string()),
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
    # OpenTelemetry's ids, lowercase hex (docs/schema.md). Not dictionary-encoded: nearly every value differs.
    pa.field("trace_id", pa.string()),
    pa.field("span_id", pa.string()),
    pa.field("protocol", pa.string()),
    pa.field("event_id", pa.string()),
    # The row's own app-env when the partition's `app_env` is a stand-in (paths.py): past the
    # day's cap of new streams, or a name the metastore cannot hold. NULL otherwise.
    pa.field("original_app_env", pa.string()),
    # True when `created_at` lies outside the window around the row's arrival, so that `date` is
    # the day it arrived instead of the day of `created_at` (table/event_time.py). NULL otherwise.
    pa.field("created_out_of_window", pa.bool_()),
    pa.field("date", pa.date32(), nullable=False),
])

COLUMNS: tuple[str, ...] = tuple(ARROW_SCHEMA.names)

# `doc`: the body parsed as JSON when it is a JSON object, else NULL, encoded by the importer
# (importer/variant.py) as Spark's VARIANT. Objects only: a body that is a top-level scalar or
# array is still whole in `body`. DOC_EXPR is the same in Spark SQL, what tests/test_variant.py
# compares the encoder with byte for byte. docs/schema.md has the rest.
DOC_COLUMN = "doc"
DOC_EXPR = "CASE WHEN trim(LEADING ' \\t\\r\\n' FROM body) LIKE '{%' THEN try_parse_json(body) END"
# `doc` as the importer hands it to delta-rs: the Variant's two binaries, in the order Delta's
# `variantType` feature stores them.
DOC_ARROW_TYPE = pa.struct([pa.field("metadata", pa.large_binary(), nullable=False),
                            pa.field("value", pa.large_binary(), nullable=False)])

# Parquet dictionary encoding only where values repeat (table/delta.py's writer properties):
# trying a dictionary on bodies, timestamps and ids and then falling back costs CPU on every
# write and saves little disk.
DICTIONARY_COLUMNS = ("app", "env", "topic", "device", "host", "severity", "level", "action", "code",
                      "protocol", "journal", "parse_error")


def qualified(database: str = DEFAULT_DATABASE) -> str:
    return f"`{database}`.`{TABLE_NAME}`"


def sql_string(text: str) -> str:
    """`text` inside single quotes in Spark SQL."""
    return text.replace("\\", "\\\\").replace("'", "\\'")
