"""The `logjam.messages` table in the Spark catalog: creating it, registering partitions, and reading it back.

The table is an external Parquet table whose partitions (importer, app_env, date) are
tracked by the metastore, so `SELECT ... FROM logjam.messages`, `SHOW PARTITIONS` and
JDBC clients see it by name. Importers write their rows with a plain partitioned write
below their own root (an INSERT INTO the table would make Spark list every partition of
the table on each write: 18-20 s per write at 5,000 partitions, measured) and register
the partitions a batch needs *before* its write commits, so every committed row is
queryable at once. `logjam-spark` reads file listings uncached
(`spark.sql.hive.filesourcePartitionFileCacheSize=0`) for the same reason.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any, Iterable

from importer.paths import local_path
from importer.schema import DEFAULT_DATABASE, TABLE_NAME, qualified, sql_string, table_ddl

log = logging.getLogger(__name__)

# Registered partitions are remembered this long; afterwards a write registers them again
# (a no-op unless retention or a person dropped one meanwhile).
REGISTERED_TTL_S = 600.0
# At most this many PARTITION clauses in one ALTER TABLE statement.
_PARTITIONS_PER_STATEMENT = 200

PartitionSpec = tuple[str, str]  # (app_env, "YYYY-MM-DD") below one importer


def ensure_table(spark: Any, database: str, location: str) -> str:
    """Create the database and the table over `location` unless they exist; return the table's location.

    A table created over a location that already holds rows (written before the catalog
    existed, or a metastore that was reset) adopts them: their partitions are registered.
    """
    # Checked first: CREATE DATABASE IF NOT EXISTS on an existing database still makes the Hive
    # metastore log AlreadyExistsException with a 100-line stack trace.
    if not spark.catalog.databaseExists(database):
        spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    if not spark.catalog.tableExists(f"{database}.{TABLE_NAME}"):
        local = local_path(location)
        if local is not None:
            local.mkdir(parents=True, exist_ok=True)
        spark.sql(table_ddl(database, location))
        started = time.monotonic()
        found = 0
        if local is None or any(p.name.startswith("importer=") for p in local.iterdir()):
            spark.sql(f"ALTER TABLE {qualified(database)} RECOVER PARTITIONS")
            found = len(spark.sql(f"SHOW PARTITIONS {qualified(database)}").collect())
            from importer.compaction import adopt_compacted  # it builds on this module

            adopt_compacted(spark, database, location)
        log.info("created table %s.%s at %s%s", database, TABLE_NAME, location,
                 f"; adopted {found} existing partitions in {time.monotonic() - started:.1f}s" if found else "")
    actual = table_location(spark, database)
    if location and actual.rstrip("/") != _qualify(location).rstrip("/"):
        log.warning("table %s.%s already exists at %s (not %s); writing there", database, TABLE_NAME, actual, location)
    return actual


def _qualify(location: str) -> str:
    return location if "://" in location or location.startswith("file:") else f"file:{location}"


def table_location(spark: Any, database: str = DEFAULT_DATABASE) -> str:
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {qualified(database)}").collect()
    for row in rows:
        if row[0] == "Location":
            return str(row[1])
    raise RuntimeError(f"the catalog has no location for {database}.{TABLE_NAME}")


def partition_clause(importer: int, app_env: str, date: str) -> str:
    return f"PARTITION (importer={int(importer)}, app_env='{sql_string(app_env)}', date='{date}')"


class Partitions:
    """Registers an importer's partitions in the catalog, remembering which it registered recently."""

    def __init__(self, database: str, importer: int, ttl: float = REGISTERED_TTL_S) -> None:
        self.database = database
        self.importer = importer
        self.ttl = ttl
        self._registered: dict[PartitionSpec, float] = {}

    def register(self, spark: Any, specs: Iterable[PartitionSpec]) -> int:
        """ADD IF NOT EXISTS every spec not registered in the last `ttl` seconds; returns how many were sent."""
        now = time.monotonic()
        todo = [s for s in specs if self._registered.get(s, -1e18) + self.ttl < now]
        for i in range(0, len(todo), _PARTITIONS_PER_STATEMENT):
            chunk = todo[i : i + _PARTITIONS_PER_STATEMENT]
            clauses = " ".join(partition_clause(self.importer, a, d) for a, d in chunk)
            spark.sql(f"ALTER TABLE {qualified(self.database)} ADD IF NOT EXISTS {clauses}")
        for s in todo:
            self._registered[s] = now
        if len(self._registered) > 100_000:
            self._registered = {s: t for s, t in self._registered.items() if t + self.ttl >= now}
        return len(todo)

    def forget(self) -> None:
        self._registered.clear()


def _owner(importer: int | None) -> str:
    """The rows a resume query reads: one importer's, or every importer's (progress belongs to the device)."""
    return "TRUE" if importer is None else f"importer = {int(importer)}"


def max_seqs(spark: Any, database: str, importer: int | None) -> dict[int, dict[str | None, tuple[int, Any]]]:
    """Per device and journal: (max(seq), max(ingested_at)) among `importer`'s rows, or every importer's
    rows with None ({} before the first commit)."""
    rows = spark.sql(
        f"SELECT device, journal, max(seq) AS seq, max(ingested_at) AS at FROM {qualified(database)} "
        f"WHERE {_owner(importer)} GROUP BY device, journal").collect()
    out: dict[int, dict[str | None, tuple[int, Any]]] = {}
    for r in rows:
        if r["seq"] is not None:
            out.setdefault(int(r["device"]), {})[r["journal"]] = (int(r["seq"]), r["at"])
    return out


def recent_event_ids(spark: Any, database: str, importer: int | None, limit: int) -> list[tuple[str, str]]:
    """(app_env, event_id) of the newest `limit` rows with an id among `importer`'s rows (every importer's
    with None), oldest first."""
    table = spark.sql(
        f"SELECT app_env, event_id FROM {qualified(database)} WHERE {_owner(importer)} "
        f"AND event_id IS NOT NULL ORDER BY ingested_at DESC LIMIT {int(limit)}").toArrow()
    app_envs, ids = table.column("app_env").to_pylist(), table.column("event_id").to_pylist()
    return list(zip(reversed(app_envs), reversed(ids)))


def date_text(days_since_epoch: int) -> str:
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=days_since_epoch)).isoformat()
