"""`logjam-sql --trace ID`: every row that carries one request id or trace id, from every stream, as a timeline.

A request crosses services, and each service's logs land in its own stream; what a person
debugging it wants is all of them in time order. The lookup names the id in `request_id`
and `trace_id` (a trace id is matched lowercased, as the importers store it), and every
file of the table has bloom filters on both (docs/schema.md, "Layout for lookups"), so the
files without it are skipped unread. `--days N` searches only the last N days; the header
says how many days the search covered, counted from the table's partitions.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Sequence

from table.schema import sql_string

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


def query(table: str, trace: str, first_day: datetime.date | None) -> str:
    ids = sql_string(trace)
    where = f"(request_id = '{ids}' OR trace_id = '{sql_string(trace.lower())}')"
    if first_day is not None:
        where += f" AND date >= DATE'{first_day.isoformat()}'"
    return f"SELECT {', '.join(COLUMNS)} FROM {table} WHERE {where} ORDER BY created_at, app_env, seq"


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


def find(spark: Any, table: str, trace: str, days: int) -> Timeline:
    """Run the lookup on `spark` (the table qualified as `table`)."""
    first_day = since(days, datetime.datetime.now(datetime.timezone.utc).date())
    searched = partition_days([r[0] for r in spark.sql(f"SHOW PARTITIONS {table}").collect()], first_day)
    rows = [r.asDict() for r in spark.sql(query(table, trace, first_day)).collect()]
    return Timeline(trace, searched, rows)


def header(timeline: Timeline) -> str:
    """`<id>: N rows from S streams, searched D days (first .. last)`."""
    rows, days = timeline.rows, timeline.days
    streams = {r["app_env"] for r in rows}
    span = f"{days[0]} .. {days[-1]}" if days else "no partitions"
    return (f"{timeline.trace}: {len(rows)} row{'s' if len(rows) != 1 else ''} from {len(streams)} "
            f"stream{'s' if len(streams) != 1 else ''}, searched {len(days)} day{'s' if len(days) != 1 else ''} ({span})")


def render(timeline: Timeline, max_width: int = 160) -> str:
    """The timeline as text: the header, then one line a row with its offset from the first."""
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
