"""Which partition each row of a batch goes to: its stream's own, or a stand-in, within the day's cap.

A stream's rows go to the partition `(app_env, date)` of its name, with three
exceptions that keep one stream from harming the table or the others (docs/schema.md):
- a name too long for a directory gets a stand-in value (paths.py `dir_value`);
- past `--max-new-app-envs` partitions on one date, a new stream's rows go
  to the day's overflow partition, as Loki's stream limits guard its index; existing
  streams keep theirs;
- rows whose write keeps failing go to the quarantine partition (importer/write.py).
A row whose partition value is not its name keeps the name in `original_app_env`.
"""

from __future__ import annotations

import logging
import datetime
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from table.paths import OVERFLOW, dir_value, is_stand_in

log = logging.getLogger(__name__)

DEFAULT_MAX_NEW_APP_ENVS = 5_000
_KEEP_DAYS = 3  # dates whose partition sets stay in memory (late rows for older days re-learn them)


def date_text(days_since_epoch: int) -> str:
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=days_since_epoch)).isoformat()


def partitions_of(table: pa.Table) -> list[tuple[str, str]]:
    """The (app_env, date) pairs a table's rows fall into."""
    pairs = table.group_by(["app_env", "date"]).aggregate([])
    app_envs = pairs.column("app_env").to_pylist()
    days = pc.cast(pairs.column("date"), pa.int32()).to_pylist()
    return [(a, date_text(d)) for a, d in zip(app_envs, days)]


class PartitionMap:
    """Assigns partition values to one importer's rows, keeping each date under the cap of new streams."""

    def __init__(self, importer: int, *, max_new: int = DEFAULT_MAX_NEW_APP_ENVS,
                 on_overflow: Callable[[str, str], None] = lambda app_env, date: None) -> None:
        self.importer = importer
        self.max_new = max_new
        self._on_overflow = on_overflow
        self._days: dict[str, set[str]] | None = None
        self._assigned: dict[tuple[str, str], str] = {}
        self.overflowed = 0  # streams sent to an overflow partition since start

    def load(self, table: Any) -> None:
        """Learn from the Delta table (a `DeltaTable`) which streams already have a partition on each date
        (the cap counts them)."""
        days: dict[str, set[str]] = {}
        for values in table.partitions():
            days.setdefault(values["date"], set()).add(values["app_env"])
        self._days = days

    def value(self, app_env: str, date: str) -> str:
        key = (app_env, date)
        assigned = self._assigned.get(key)
        if assigned is not None:
            return assigned
        value = dir_value(app_env)
        days = self._days if self._days is not None else {}
        known = days.setdefault(date, set())
        if value not in known and not is_stand_in(value) and len(known) >= self.max_new:
            self.overflowed += 1
            self._on_overflow(app_env, date)
            value = OVERFLOW
        known.add(value)
        self._assigned[key] = value
        if len(self._assigned) > 200_000 or len(days) > _KEEP_DAYS * 2:
            self._forget_old(days)
        return value

    def _forget_old(self, days: dict[str, set[str]]) -> None:
        keep = sorted(days)[-_KEEP_DAYS:]
        for date in list(days):
            if date not in keep:
                del days[date]
        self._assigned = {k: v for k, v in self._assigned.items() if k[1] in keep}

    def apply(self, table: pa.Table) -> tuple[pa.Table, list[tuple[str, str]]]:
        """The table with `app_env` as the directory each row goes to and `original_app_env` filled
        where the partition value is not the name; and the (partition value, date) pairs to register."""
        pairs = partitions_of(table)
        values = {pair: self.value(*pair) for pair in pairs}
        specs = sorted({(v, d) for (_, d), v in values.items()})
        if all(v == a and dir_value(v) == v for (a, _), v in values.items()):
            return table, specs
        apps = table.column("app_env").to_pylist()
        days = [date_text(d) for d in pc.cast(table.column("date"), pa.int32()).to_pylist()]
        rows = [values[(a, d)] for a, d in zip(apps, days)]
        dirs = pa.array([dir_value(v) for v in rows], pa.string())
        kept = table.column("original_app_env").to_pylist()  # a quarantined row's name is there already
        # The table's partition value is its directory's name, so a hashed directory is a stand-in too.
        original = pa.array([o if o is not None else (None if dir_value(v) == a else a)
                             for a, v, o in zip(apps, rows, kept)], pa.string())
        table = table.set_column(table.schema.get_field_index("app_env"), "app_env", dirs)
        table = table.set_column(table.schema.get_field_index("original_app_env"), "original_app_env", original)
        return table, specs
