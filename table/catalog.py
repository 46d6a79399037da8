"""The `messages` Delta table by name in the Spark catalog: `<database>.messages` over the table's location.

delta-rs creates the table (table/delta.py) and only delta-rs writes it; the catalog holds just
its name and location (`CREATE TABLE ... USING delta LOCATION`, no columns: Delta reads the
schema and the partitions from the table's log), so `SELECT ... FROM logjam.messages` and JDBC
clients find it by name and every query reads the latest commit.
"""

from __future__ import annotations

import logging
from typing import Any

from table.delta import open_table
from table.paths import local_path
from table.schema import DEFAULT_DATABASE, TABLE_NAME, qualified, sql_string

log = logging.getLogger(__name__)


def ensure_table(spark: Any, database: str, location: str) -> str:
    """Create the Delta table at `location` (with delta-rs) unless it exists, name it `<database>.messages` in
    `spark`'s catalog unless the catalog names it already, and return the location the catalog names.

    A catalog entry of that name that is not a Delta table (an install before the table was Delta)
    is dropped first: its entry only, for an external table's files are left where they are. A
    managed one is refused, since dropping it would delete its files."""
    open_table(_delta_rs_location(location))
    # Checked first: CREATE DATABASE IF NOT EXISTS on an existing database still makes the Hive
    # metastore log AlreadyExistsException with a 100-line stack trace.
    if not spark.catalog.databaseExists(database):
        spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    name = qualified(database)
    if spark.catalog.tableExists(f"{database}.{TABLE_NAME}"):
        described = describe(spark, database)
        if described.get("Provider", "").lower() != "delta":
            if described.get("Type", "").upper() != "EXTERNAL":
                raise RuntimeError(f"{database}.{TABLE_NAME} is a {described.get('Type', '?')} "
                                   f"{described.get('Provider', '?')} table of the catalog; dropping it would delete "
                                   f"its files: rename or drop it by hand")
            spark.sql(f"DROP TABLE {name}")
            log.warning("dropped the catalog's entry for the %s table %s.%s at %s (its files are left there); "
                        "naming the Delta table instead", described.get("Provider"), database, TABLE_NAME,
                        described.get("Location"))
    spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING delta LOCATION '{sql_string(_qualify(location))}'")
    actual = table_location(spark, database)
    if actual.rstrip("/") != _qualify(location).rstrip("/"):
        log.warning("table %s.%s already exists at %s (not %s); using it", database, TABLE_NAME, actual, location)
    return actual


def _delta_rs_location(location: str) -> str:
    """`location` as delta-rs names it: a local path, or a URL whose scheme it knows (Hadoop's s3a is its s3)."""
    local = local_path(location)
    if local is not None:
        return str(local)
    return "s3://" + location[len("s3a://"):] if location.startswith("s3a://") else location


def _qualify(location: str) -> str:
    return location if "://" in location or location.startswith("file:") else f"file:{location}"


def describe(spark: Any, database: str = DEFAULT_DATABASE) -> dict[str, str]:
    """The table's `DESCRIBE TABLE EXTENDED` details: Location, Provider, Type (MANAGED, EXTERNAL), ..."""
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {qualified(database)}").collect()
    return {str(r[0]): str(r[1]) for r in rows if r[0] and r[1] is not None}


def table_location(spark: Any, database: str = DEFAULT_DATABASE) -> str:
    location = describe(spark, database).get("Location")
    if location is None:
        raise RuntimeError(f"the catalog has no location for {database}.{TABLE_NAME}")
    return location


def named_table(spark: Any, database: str, location: str) -> str:
    """The location of the table the catalog names `<database>.messages`; when it names none, the table
    at `location` is made and named first (`ensure_table`). For clients such as logjam-sql: the
    server made sure of its own table at its start."""
    if spark.catalog.tableExists(f"{database}.{TABLE_NAME}"):
        return table_location(spark, database)
    return ensure_table(spark, database, location)
