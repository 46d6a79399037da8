"""The `messages` table: its Arrow schema (an importer's decoded rows), SQL naming, and how its files are written.

docs/schema.md describes every column. The Delta table (table/delta.py) is partitioned by
`app_env` and `date`; its columns are ARROW_SCHEMA's in their order, then `doc`. The Parquet
files hold only the data columns. `table_ddl`, `partition_clause` and `CATALOG_PARTITIONS` are
the earlier Hive layout's (importer=/app_env=/date= registered in the metastore), for what still
reads or builds such a table.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

DEFAULT_DATABASE = "logjam"
TABLE_NAME = "messages"
PARTITION_COLUMNS = ("app_env", "date")  # below each importer's own root, importer=<I>
CATALOG_PARTITIONS = ("importer", "app_env", "date")

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

# `doc`: the body parsed as JSON when it is a JSON object, else NULL. An importer that places its
# own files writes `doc` into them, encoded (importer/variant.py); under --no-staging Spark makes
# it in the write's plan (`with_doc`). Objects only, because a single
# top-level scalar or array among a file's rows makes Spark (4.3) write none of the file's `doc`
# shredded (measured); such a body is still whole in `body`. docs/schema.md has the rest.
DOC_COLUMN = "doc"
DOC_EXPR = "CASE WHEN trim(LEADING ' \\t\\r\\n' FROM body) LIKE '{%' THEN try_parse_json(body) END"
DATA_COLUMNS: tuple[str, ...] = (*(c for c in COLUMNS if c not in PARTITION_COLUMNS), DOC_COLUMN)
# `doc` as an importer writes it: Parquet's Variant group of two binaries, which Spark reads as
# a VARIANT (unshredded) when the read schema says so.
DOC_ARROW_TYPE = pa.struct([pa.field("metadata", pa.large_binary(), nullable=False),
                            pa.field("value", pa.large_binary(), nullable=False)])
# What a file an importer places holds (importer/place.py), and so what an open day's merge
# of such files without Spark reads and writes (warehouse/arrow_merge.py).
FILE_SCHEMA = pa.schema([f for f in ARROW_SCHEMA if f.name not in PARTITION_COLUMNS]
                        + [pa.field(DOC_COLUMN, DOC_ARROW_TYPE)])

_SPARK_TYPES = {
    pa.string(): "STRING",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
    pa.binary(): "BINARY",
    TIMESTAMP: "TIMESTAMP",
    pa.date32(): "DATE",
}

# Parquet dictionary encoding only where values repeat. Trying a dictionary on bodies,
# timestamps and ids and then falling back costs about a third of Spark's write CPU
# (measured: 15-16 against 10-11 us per row on the benchmark's rows) and saves ~8% of disk.
# Compaction rewrites closed partitions with dictionaries everywhere and zstd.
DICTIONARY_COLUMNS = ("app", "env", "topic", "device", "host", "severity", "level", "action", "code",
                      "protocol", "journal", "parse_error")
WRITE_OPTIONS: dict[str, str] = {
    "compression": "snappy",
    "parquet.enable.dictionary": "false",
    **{f"parquet.enable.dictionary#{c}": "true" for c in DICTIONARY_COLUMNS},
}
COMPACT_OPTIONS: dict[str, str] = {"compression": "zstd", "parquet.enable.dictionary": "true"}
# The same choices in pyarrow's words: an importer's placed file (WRITE_OPTIONS), and an open
# day's merge without Spark, zstd with the same dictionaries (measured on e2e's rows: 80 bytes
# a row at 3.3 us of CPU, against 84 bytes and 3.6 us with dictionaries on every column).
ARROW_WRITE_OPTIONS: dict[str, Any] = {"compression": "snappy", "use_dictionary": list(DICTIONARY_COLUMNS),
                                       "write_statistics": True}
ARROW_MERGE_OPTIONS: dict[str, Any] = {**ARROW_WRITE_OPTIONS, "compression": "zstd"}


def with_doc(df: Any) -> Any:
    """The staged rows with `doc` added, made by Spark while it writes them."""
    return df.selectExpr("*", f"{DOC_EXPR} AS `{DOC_COLUMN}`")


def conform(table: pa.Table) -> pa.Table:
    """Rows kept by an older version (a spill file) in ARROW_SCHEMA: the columns added since are NULL."""
    if table.schema.names == ARROW_SCHEMA.names:
        return table
    n = table.num_rows
    return pa.Table.from_arrays([table.column(f.name) if f.name in table.schema.names else pa.nulls(n, f.type)
                                 for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)


def qualified(database: str = DEFAULT_DATABASE) -> str:
    return f"`{database}`.`{TABLE_NAME}`"


def spark_read_ddl(data_only: bool = False) -> str:
    """`col TYPE, ...` in the table's column order: data columns, then importer, app_env, date.

    `data_only`: just the columns a Parquet file of the table holds.
    """
    data = [f"`{f.name}` {_SPARK_TYPES[f.type]}" for f in ARROW_SCHEMA if f.name not in PARTITION_COLUMNS]
    data.append(f"`{DOC_COLUMN}` VARIANT")
    return ", ".join(data if data_only else data + ["`importer` INT", "`app_env` STRING", "`date` DATE"])


def table_ddl(database: str, location: str) -> str:
    """CREATE TABLE for the catalog: an external Parquet table over `location`, partitions tracked by the metastore."""
    return (f"CREATE TABLE IF NOT EXISTS {qualified(database)} ({spark_read_ddl()}) USING parquet "
            f"PARTITIONED BY ({', '.join(CATALOG_PARTITIONS)}) LOCATION '{sql_string(location)}'")


def sql_string(text: str) -> str:
    """`text` inside single quotes in Spark SQL."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


def partition_clause(importer: int, app_env: str, date: str) -> str:
    return f"PARTITION (importer={int(importer)}, app_env='{sql_string(app_env)}', date='{date}')"
