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

from table.protocol import adopt_compacted
from runtime.durable import make_dirs, replace_file
from table.paths import NAME_FILE, dir_value, local_path, partition_dir, unescape_partition_value
from table.schema import (DEFAULT_DATABASE, TABLE_NAME, missing_columns, partition_clause, qualified, sql_string,
                          table_ddl)

log = logging.getLogger(__name__)

# Registered partitions are remembered this long; afterwards a write registers them again
# (a no-op unless retention or a person dropped one meanwhile).
REGISTERED_TTL_S = 600.0
# PARTITION clauses per ALTER TABLE statement: one metastore call adds them all.
_PARTITIONS_PER_STATEMENT = 1000

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
            adopt_compacted(spark, database, location)
        log.info("created table %s.%s at %s%s", database, TABLE_NAME, location,
                 f"; adopted {found} existing partitions in {time.monotonic() - started:.1f}s" if found else "")
    else:
        _add_missing_columns(spark, database)
    actual = table_location(spark, database)
    if location and actual.rstrip("/") != _qualify(location).rstrip("/"):
        log.warning("table %s.%s already exists at %s (not %s); writing there", database, TABLE_NAME, actual, location)
    return actual


def _add_missing_columns(spark: Any, database: str) -> None:
    """A table created by an older version gets the data columns added since; its old files read them as NULL."""
    present = {f.name for f in spark.table(f"{database}.{TABLE_NAME}").schema.fields}
    missing = missing_columns(present)
    typed = [c for c in missing if not c.endswith(" VARIANT")]
    if typed:
        spark.sql(f"ALTER TABLE {qualified(database)} ADD COLUMNS ({', '.join(typed)})")
        log.info("added columns %s to %s.%s", ", ".join(typed), database, TABLE_NAME)
    if len(typed) < len(missing):
        _add_variant_columns(spark, database, [c for c in missing if c not in typed])


def _add_variant_columns(spark: Any, database: str, columns: list[str]) -> None:
    """VARIANT columns have no Hive type, so the metastore gets Spark's own schema format, which a Hive
    metastore refuses unless `hive.metastore.disallow.incompatible.col.type.changes` is false (as
    logjam-spark sets for its embedded one). Refused, the table goes on without them: queries cannot
    name them, and the files the importers write have them all the same."""
    try:
        spark.sql(f"ALTER TABLE {qualified(database)} ADD COLUMNS ({', '.join(columns)})")
    except Exception as e:  # the metastore's refusal arrives as whatever Spark wraps it in
        log.warning("cannot add %s to %s.%s: %s; set hive.metastore.disallow.incompatible.col.type.changes=false "
                    "in the metastore's configuration (docs/schema.md)", ", ".join(columns), database, TABLE_NAME,
                    str(e).strip().splitlines()[0] if str(e).strip() else e)
        return
    log.info("added columns %s to %s.%s", ", ".join(columns), database, TABLE_NAME)


def _qualify(location: str) -> str:
    return location if "://" in location or location.startswith("file:") else f"file:{location}"


def table_location(spark: Any, database: str = DEFAULT_DATABASE) -> str:
    rows = spark.sql(f"DESCRIBE TABLE EXTENDED {qualified(database)}").collect()
    for row in rows:
        if row[0] == "Location":
            return str(row[1])
    raise RuntimeError(f"the catalog has no location for {database}.{TABLE_NAME}")


class Partitions:
    """Registers an importer's partitions in the catalog, remembering which it registered recently.

    Each partition is registered with its directory as its location, and that directory is
    made here first: the metastore then does not make it itself, which Hadoop's local
    filesystem does by forking `chmod` (about 20 ms a partition, measured; 2-3 ms without).
    A directory named after a hash (paths.dir_value) keeps the value it stands for in
    `_app_env`, for anyone reading the tree without the catalog.
    """

    def __init__(self, database: str, importer: int, root: str, ttl: float = REGISTERED_TTL_S) -> None:
        self.database = database
        self.importer = importer
        self.root = root
        self.root_dir = local_path(root)
        self.ttl = ttl
        self._registered: dict[PartitionSpec, float] = {}

    def register(self, spark: Any, specs: Iterable[PartitionSpec]) -> int:
        """ADD IF NOT EXISTS every spec not registered in the last `ttl` seconds; returns how many were sent."""
        now = time.monotonic()
        todo = [s for s in specs if self._registered.get(s, -1e18) + self.ttl < now]
        for i in range(0, len(todo), _PARTITIONS_PER_STATEMENT):
            chunk = todo[i : i + _PARTITIONS_PER_STATEMENT]
            clauses = []
            for value, date in chunk:
                location = partition_dir(self.root, value, date)
                self._make_dir(value, location)
                clauses.append(f"{partition_clause(self.importer, value, date)} LOCATION '{sql_string(location)}'")
            spark.sql(f"ALTER TABLE {qualified(self.database)} ADD IF NOT EXISTS {' '.join(clauses)}")
        for s in todo:
            self._registered[s] = now
        if len(self._registered) > 100_000:
            self._registered = {s: t for s, t in self._registered.items() if t + self.ttl >= now}
        return len(todo)

    def _make_dir(self, value: str, location: str) -> None:
        path = local_path(location)
        if path is None:
            return
        try:
            make_dirs(path)
        except FileNotFoundError:  # retention removed the app_env dir between two mkdirs: once more
            make_dirs(path)
        if dir_value(value) != value:
            name = path.parent / NAME_FILE
            if not name.exists():
                replace_file(name, value.encode("utf-8", "surrogateescape"))

    def is_registered(self, spec: PartitionSpec) -> bool:
        return self._registered.get(spec, -1e18) + self.ttl >= time.monotonic()

    def forget(self, specs: Iterable[PartitionSpec] | None = None) -> None:
        """Register these specs (every one with None) again at their next use."""
        if specs is None:
            self._registered.clear()
        for spec in specs or ():
            self._registered.pop(spec, None)


def registered_app_envs(spark: Any, database: str, importer: int) -> dict[str, set[str]]:
    """date -> the app_env values of this importer's partitions in the catalog."""
    out: dict[str, set[str]] = {}
    for row in spark.sql(f"SHOW PARTITIONS {qualified(database)} PARTITION (importer={int(importer)})").collect():
        parts = dict(p.split("=", 1) for p in str(row[0]).split("/"))
        out.setdefault(parts["date"], set()).add(unescape_partition_value(parts["app_env"]))
    return out


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


def seqs_in_table(spark: Any, database: str, importer: int, device: int, low: int, high: int,
                  partitions: tuple[Iterable[str], str] | None = None) -> set[int]:
    """The seqs between `low` and `high` of `device` among `importer`'s rows: what a commit or a spill
    file already put there. `partitions` = (app_env values, day) narrows the query to those partitions."""
    where = ""
    if partitions is not None:
        values, day = partitions
        names = ", ".join(f"'{sql_string(v)}'" for v in sorted(values))
        where = f"AND app_env IN ({names}) AND date = DATE'{sql_string(day)}' "
    rows = spark.sql(f"SELECT seq FROM {qualified(database)} WHERE importer = {int(importer)} {where}"
                     f"AND device = {int(device)} AND seq BETWEEN {int(low)} AND {int(high)}").collect()
    return {int(r[0]) for r in rows}


def recent_event_ids(spark: Any, database: str, importer: int | None, limit: int) -> list[tuple[str, str]]:
    """(app_env, event_id) of the newest `limit` rows with an id among `importer`'s rows (every importer's
    with None), oldest first."""
    table = spark.sql(
        f"SELECT coalesce(original_app_env, app_env) AS app_env, event_id FROM {qualified(database)} "
        f"WHERE {_owner(importer)} "
        f"AND event_id IS NOT NULL ORDER BY ingested_at DESC LIMIT {int(limit)}").toArrow()
    app_envs, ids = table.column("app_env").to_pylist(), table.column("event_id").to_pylist()
    return list(zip(reversed(app_envs), reversed(ids)))


def date_text(days_since_epoch: int) -> str:
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=days_since_epoch)).isoformat()
