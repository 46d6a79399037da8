"""`logjam-sql --trace ID`: every row that carries one request id or trace id, from every stream, as a timeline.

A request crosses services, and each service's logs land in its own stream; what a person
debugging it wants is all of them in time order. The lookup names the id in `request_id`
and `trace_id` (a trace id is matched lowercased, as the importers store it) in one query on
the Delta table: the log's per-file min/max statistics of both columns rule out files whose
range cannot hold the id, and in the files left the Parquet bloom filter the writers add on
each lookup column (table/delta.py `writer_properties`) rules out nearly every row group
(docs/schema.md, "Layout for lookups"). `lookup` is that query for any of the lookup columns.
`--days N` searches only the last N days; the header says how many days the search covered,
counted from the table's partitions.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from table.catalog import table_location
from table.paths import local_path
from table.schema import qualified, sql_string

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


@dataclass(frozen=True, slots=True)
class Found:
    rows: list[dict[str, Any]]
    days: list[datetime.date]  # the partitions' days searched, oldest first


def lookup(spark: Any, database: str, probes: Mapping[str, Sequence[str]], columns: Sequence[str],
           first_day: datetime.date | None = None, location: str | None = None, order_by: str = "") -> Found:
    """The rows where any `column = value` of `probes` holds, `columns` of them, ordered by the columns of
    `order_by` (names, comma-separated), from `first_day` on. `location`: the table's, when the caller
    knows it (else asked)."""
    table = qualified(database)
    since_day = f" AND date >= DATE'{first_day.isoformat()}'" if first_day is not None else ""
    order = f" ORDER BY {order_by}" if order_by else ""
    rows = spark.sql(f"SELECT {', '.join(columns)} FROM {table} WHERE {ids_where(probes)}{since_day}{order}").collect()
    return Found([r.asDict() for r in rows], table_days(spark, database, location, first_day))


def table_days(spark: Any, database: str, location: str | None, first_day: datetime.date | None) -> list[datetime.date]:
    """The days the table has partitions of, from `first_day` on: from the Delta log by delta-rs where the
    table is on this machine's disk (the log alone, no data file), else by Spark."""
    table_dir = local_path(location or table_location(spark, database))
    if table_dir is not None and table_dir.is_dir():
        from deltalake import DeltaTable

        days = {datetime.date.fromisoformat(p["date"]) for p in DeltaTable(str(table_dir)).partitions()}
    else:
        days = {r[0] for r in spark.sql(f"SELECT DISTINCT date FROM {qualified(database)}").collect()}
    return sorted(d for d in days if first_day is None or d >= first_day)


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
