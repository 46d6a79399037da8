"""`logjam-sql --trace ID`: every row that carries one request id or trace id, from every stream, as a timeline.

A request crosses services, and each service's logs land in its own stream; what a person
debugging it wants is all of them in time order. The lookup names the id in `request_id`
and `trace_id` (a trace id is matched lowercased, as the importers store it), and every
file of the table has bloom filters on both (docs/schema.md, "Layout for lookups"). Before
Spark plans, the lookup index (table/lookup_index.py, table/lookup_plan.py) rules out the files
that cannot hold the id, and Spark reads the others by path (no catalog, no listing: the
catalog's part alone was 0.5 s of a lookup), with each row's partition values from its file's
partition; a partition the index cannot speak for is queried through the table. `lookup` is that path for any
of the indexed columns; `benchmarks/month.py` times its lookups through it. `--days N` searches only the
last N days; the header says how many days the search covered, counted from the table's
partitions.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from table import lookup_plan
from table.catalog import table_location
from table.paths import local_path
from table.schema import CATALOG_PARTITIONS, qualified, spark_read_ddl, sql_string

log = logging.getLogger(__name__)

# What a timeline line shows, after its time: where the row came from, and what it says.
COLUMNS = ("created_at", "app_env", "level", "host", "message", "request_id", "trace_id", "span_id", "seq", "body")


@dataclass(frozen=True, slots=True)
class Timeline:
    trace: str
    days: list[datetime.date]  # the partitions' days the search covered, oldest first
    rows: list[dict[str, Any]]  # in time order


def since(days: int, today: datetime.date) -> datetime.date | None:
    """The first day searched with `--days N` (0: every day)."""
    return today - datetime.timedelta(days=days - 1) if days > 0 else None


def ids_where(probes: Mapping[str, Sequence[str]]) -> str:
    """`(c1 = 'v1' OR c2 = 'v2' ...)` for every (column, value) of `probes`."""
    return "(" + " OR ".join(f"{c} = '{sql_string(v)}'" for c, vs in probes.items() for v in vs) + ")"


def probes_of(trace: str) -> dict[str, list[str]]:
    """What `--trace ID` matches: the id as a request id, and lowercased as a trace id."""
    return {"request_id": [trace], "trace_id": [trace.lower()]}


def partition_days(partitions: Sequence[str], first_day: datetime.date | None) -> list[datetime.date]:
    """The distinct days of `SHOW PARTITIONS` lines (`importer=0/app_env=x/date=2026-11-28`) from `first_day` on."""
    days = set()
    for spec in partitions:
        for part in spec.split("/"):
            if part.startswith("date="):
                day = datetime.date.fromisoformat(part[5:])
                if first_day is None or day >= first_day:
                    days.add(day)
    return sorted(days)


@dataclass(frozen=True, slots=True)
class Found:
    rows: list[dict[str, Any]]
    days: list[datetime.date]  # the partitions' days searched, oldest first


def lookup(spark: Any, database: str, probes: Mapping[str, Sequence[str]], columns: Sequence[str],
           first_day: datetime.date | None = None, location: str | None = None, order_by: str = "") -> Found:
    """The rows where any `column = value` of `probes` holds, `columns` of them, ordered by the columns of
    `order_by` (names, comma-separated): only the files the lookup index leaves are read. `location`: the
    table's, when the caller knows it (else asked)."""
    table = qualified(database)
    table_dir = local_path(location or table_location(spark, database))
    if table_dir is None or not table_dir.is_dir():  # the table is not on this machine's disk: no index here
        days = partition_days([r[0] for r in spark.sql(f"SHOW PARTITIONS {table}").collect()], first_day)
        since = f" AND date >= DATE'{first_day.isoformat()}'" if first_day is not None else ""
        order = f" ORDER BY {order_by}" if order_by else ""
        sql = f"SELECT {', '.join(columns)} FROM {table} WHERE {ids_where(probes)}{since}{order}"
        return Found([r.asDict() for r in spark.sql(sql).collect()], days)
    for attempt in range(READ_ATTEMPTS):
        found = lookup_plan.plan(table_dir, probes, first_day.isoformat() if first_day is not None else None)
        log.info("lookup index: %d of %d partitions to query (%d files or partitions unindexed)",
                 len(found.search), len(found.every), found.unindexed)
        try:
            rows = _read(spark, table, found, probes, columns)
        except Exception as e:  # noqa: BLE001 (a named file merged and deleted since the plan: plan again)
            if attempt + 1 == READ_ATTEMPTS or not any(w in str(e) for w in GONE):
                raise
            log.info("lookup: a file went while read, planning again: %s", str(e).splitlines()[0])
            continue
        keys = [c.strip() for c in order_by.split(",") if c.strip()]
        rows.sort(key=lambda r: tuple((r[k] is not None, r[k]) for k in keys))
        return Found(rows, [datetime.date.fromisoformat(d) for d in found.days])
    raise AssertionError("unreachable")


# How often a lookup plans again when a file it named was deleted before Spark read it (a merge's
# swap, then the replaced files' grace, between the plan and the read: minutes, so rarely twice).
READ_ATTEMPTS = 3
GONE = ("PATH_NOT_FOUND", "FILE_NOT_EXIST", "FileNotFound")  # Spark's errors for a file gone before or while read


def _read(spark: Any, table: str, found: lookup_plan.LookupPlan, probes: Mapping[str, Sequence[str]],
          columns: Sequence[str]) -> list[dict[str, Any]]:
    """`columns` of the rows of `found`'s files (read by path: no catalog, no listing) and of its partitions
    searched whole (through the table) where an id of `probes` is."""
    if not found.search:
        return []
    by_name = lookup_plan.named_files(found)
    data = [c for c in columns if c not in CATALOG_PARTITIONS]
    rows = []
    if by_name:
        paths = [f"file://{part.dir / rel}" for rel, part in by_name.values()]  # (partition dirs escape glob chars)
        df = spark.read.schema(spark_read_ddl(data_only=True)).parquet(*paths).where(ids_where(probes))
        for r in df.select(*data, "_metadata.file_name").collect():
            row = r.asDict()
            part = by_name[row.pop("file_name")][1]
            values = {"importer": part.importer, "app_env": part.app_env,
                      "date": datetime.date.fromisoformat(part.date)}
            rows.append({c: values[c] if c in values else row[c] for c in columns})
    where = lookup_plan.predicate(found)
    if where is not None:
        sql = f"SELECT {', '.join(columns)} FROM {table} WHERE {ids_where(probes)} AND {where}"
        rows += [r.asDict() for r in spark.sql(sql).collect()]
    return rows


def find(spark: Any, database: str, trace: str, days: int, location: str | None = None) -> Timeline:
    """`--trace`'s lookup on `spark` in `database`'s table."""
    first_day = since(days, datetime.datetime.now(datetime.timezone.utc).date())
    found = lookup(spark, database, probes_of(trace), COLUMNS, first_day, location, "created_at, app_env, seq")
    return Timeline(trace, found.days, found.rows)


def header(timeline: Timeline) -> str:
    """`<id>: N rows from S streams, searched D days (first .. last)`."""
    rows, days = timeline.rows, timeline.days
    streams = {r["app_env"] for r in rows}
    span = f"{days[0]} .. {days[-1]}" if days else "no partitions"
    return (f"{timeline.trace}: {len(rows)} row{'s' if len(rows) != 1 else ''} from {len(streams)} "
            f"stream{'s' if len(streams) != 1 else ''}, searched {len(days)} day{'s' if len(days) != 1 else ''} ({span})")


def render(timeline: Timeline, max_width: int = 160) -> str:
    """The timeline as text: the header, then one line a row with its offset from the first, cut to
    `max_width` characters (0: whole)."""
    rows = timeline.rows
    out = [header(timeline)]
    start = rows[0]["created_at"] if rows else None
    for r in rows:
        at: datetime.datetime = r["created_at"]
        offset = (at - start).total_seconds() if start is not None else 0.0
        what = r["message"] if r["message"] is not None else (r["body"] or "")
        line = (f"{at.isoformat(sep=' ', timespec='milliseconds')}  +{offset:9.3f}s  {r['app_env']:<20} "
                f"{(r['level'] or '-'):<7} {(r['host'] or '-'):<16} {what}")
        line = line.replace("\n", "\\n")
        out.append(line if not max_width or len(line) <= max_width else line[: max_width - 1] + "…")
    return "\n".join(out)
