"""A table of the version before a column, for the tests that a new column joins it as the earlier ones did
(tests/test_table_otel_columns.py, tests/test_event_time_window.py): the older DDL, files written by a
Spark job as that version wrote them, and logjam-sql's compaction of their day, which must merge old and
new files into one."""

from __future__ import annotations

import datetime
import subprocess
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from harness.processes import command
from table.paths import partition_dir
from table.protocol import live_files, read_marker
from table.schema import PARTITION_COLUMNS, WRITE_OPTIONS, partition_clause, qualified, table_ddl, with_doc
from tests.spark_fixture import database_for

APP_ENV = "old-prod"


def yesterday() -> tuple[int, str]:
    """An arrival time of yesterday, in microseconds, and its date: a closed day, which compaction merges."""
    arrived_us = time.time_ns() // 1000 - 86_400_000_000
    return arrived_us, datetime.datetime.fromtimestamp(arrived_us / 1e6, datetime.timezone.utc).date().isoformat()


def older_table(spark: Any, warehouse: Path, without: str) -> tuple[str, str]:
    """The table created as the version before made it, its DDL without `without` (the new columns'
    `, `name` TYPE` text); returns (database, location)."""
    database = database_for(warehouse)
    location = str(warehouse / "messages")
    ddl = table_ddl(database, location)
    assert without in ddl, f"{without!r} is not in the DDL"
    spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    spark.sql(ddl.replace(without, ""))
    return database, location


def write_as_before(spark: Any, database: str, location: str, rows: pa.Table, day: str) -> None:
    """`rows` of APP_ENV (without the new columns) written by a Spark job, as the version before wrote
    them, into importer 0's root; their partition registered."""
    root = f"{location}/importer=0"
    with_doc(spark.createDataFrame(rows)).write.options(**WRITE_OPTIONS).mode("append") \
        .partitionBy(*PARTITION_COLUMNS).parquet(root)
    spark.sql(f"ALTER TABLE {qualified(database)} ADD {partition_clause(0, APP_ENV, day)} "
              f"LOCATION '{partition_dir(root, APP_ENV, day)}'")


def compacted(spark_url: str, database: str, location: str, day: str) -> list[Path]:
    """Compact the table with logjam-sql (a closed day, no grace), check that APP_ENV's partition of `day`
    was swapped, and return the files a reader of it sees now."""
    done = subprocess.run([command("logjam-sql"), "--spark", spark_url, "--warehouse", str(Path(location).parent),
                           "--database", database, "--compact", "--older-than", "0", "--compact-grace", "0"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr + done.stdout
    pdir = Path(partition_dir(f"{location}/importer=0", APP_ENV, day))
    marker = read_marker(pdir)
    assert marker is not None and marker.state == "done", done.stdout
    return live_files(pdir)
