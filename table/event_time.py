"""The day a row is filed under: the day of its own time when that lies within a window around its
arrival, else the day it arrived.

A row's `date` partition is the UTC day of `created_at` (the event's own time, from the
shipper). A broken clock or a replayed archive can send a time years away: filed under that
day, the row would either make a partition that never expires (the future, year 9999) or
land in a day retention drops on its next pass, a minute after the row was acknowledged. So,
as Splunk's MAX_DAYS_AGO/MAX_DAYS_HENCE do, a time more than `max_days_ago` days before
`ingested_at` or more than `max_days_hence` after it is not used for the partition: the row
goes to the day it arrived, keeps its own time in `created_at`, and carries
`created_out_of_window = true` (NULL otherwise: a column that is nearly all NULL costs the
Parquet files next to nothing). `max_days_ago` is the table's retention (`--retention-days`);
without retention (0) only the future is bounded.

This runs once per chunk of rows, on Arrow columns (`EventWindow.dates`), not once per row:
any decoder that produces `created_at` and `ingested_at` calls it to get `date` and the mark.
Retention (warehouse/maintenance.py) keeps a day until the retention has passed for the
newest arrival in it too, so a late row inside the window is never dropped sooner either.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

DAY_US = 86_400_000_000
MAX_DAYS_HENCE = 1

_NULL_MARK = pa.scalar(None, pa.bool_())
_MARK = pa.scalar(True)


@dataclass(frozen=True, slots=True)
class EventWindow:
    """How far a row's own time may lie from its arrival and still choose its partition."""

    max_days_ago: int | None = None  # None (no retention): no limit into the past
    max_days_hence: int = MAX_DAYS_HENCE

    @classmethod
    def for_retention(cls, retention_days: int) -> "EventWindow":
        return cls(retention_days if retention_days > 0 else None)

    def describe(self) -> str:
        ago = f"{self.max_days_ago} days" if self.max_days_ago is not None else "any time"
        return f"event time up to {ago} before arrival and {self.max_days_hence} day(s) after it"

    def dates(self, created_us: pa.Array, ingested_us: pa.Array) -> tuple[pa.Array, pa.Array]:
        """(`date` as date32, the mark: true where `created_us` lies outside the window, else NULL),
        from two int64 arrays of microseconds since the epoch, both non-negative."""
        # How far the event's time lies before its arrival (negative: ahead of it). No overflow:
        # both are below 2.6e17 (year 9999 in microseconds).
        lag = pc.subtract(ingested_us, created_us)
        inside = pc.greater_equal(lag, -self.max_days_hence * DAY_US)
        if self.max_days_ago is not None:
            inside = pc.and_(inside, pc.less_equal(lag, self.max_days_ago * DAY_US))
        if pc.all(inside).as_py():
            return _days(created_us), pa.nulls(len(created_us), pa.bool_())
        return _days(pc.if_else(inside, created_us, ingested_us)), pc.if_else(inside, _NULL_MARK, _MARK)


def _days(us: pa.Array) -> pa.Array:
    # Integer division truncates, which is the floor here: every time is at or after the epoch.
    return pc.divide(us, DAY_US).cast(pa.int32()).cast(pa.date32())


def moved_by_stream(app_envs: pa.Array, created: pa.Array, mark: pa.Array) -> dict[str, tuple[int, int, int]]:
    """{app_env: (rows marked, earliest and latest `created_at` of them in microseconds)}; {} when none is."""
    if mark.null_count == len(mark):
        return {}
    moved = pa.table({"app_env": app_envs, "created": created}).filter(pc.is_valid(mark))
    stats = moved.group_by("app_env").aggregate([("created", "count"), ("created", "min"), ("created", "max")])
    return {a: (n, lo, hi) for a, n, lo, hi in zip(*(stats.column(c).to_pylist() for c in
                                                     ("app_env", "created_count", "created_min", "created_max")))}
