"""A lookup's plan: which files of which partitions may hold an id, by the lookup index (table/lookup_index.py).

tools/trace.py's `lookup` (behind `logjam-sql --trace`) asks `plan` before Spark plans, and
reads only the files it leaves, by path (`named_files`): Spark then lists and opens nothing
else. A partition whose live files are not known (a swap under way, a torn marker, a drop) or
whose day's index does not parse is searched whole, through the table (`predicate`); a live
file the index has no filter for (placed since the last maintenance pass) is read. A merge's
swap between the plan and the read does not hide rows: the files it replaced stay readable
for their grace (table/protocol.py), and one deleted meanwhile fails the read, which the
lookup then plans again.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import pyarrow as pa

from table.layout import LOOKUP_COLUMNS
from table.lookup_index import base_name, hashes, live_files, may_hold, open_day, partitions
from table.protocol import PartitionRef
from table.schema import sql_string

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Search:
    """One partition to query: `files` (relative to its dir) the only ones that may hold the id, or None: all."""

    part: PartitionRef
    files: tuple[str, ...] | None


@dataclass(frozen=True, slots=True)
class LookupPlan:
    """What a lookup queries: of `every` partition from the first day on, those of `search`. `unindexed`: the
    files searched for want of a filter, and the partitions searched whole."""

    every: tuple[PartitionRef, ...]
    search: tuple[Search, ...]
    unindexed: int

    @property
    def days(self) -> list[str]:
        """The distinct days of all the partitions, searched or ruled out."""
        return sorted({p.date for p in self.every})


def plan(table_dir: Path, probes: Mapping[str, Sequence[str]], first_day: str | None = None) -> LookupPlan:
    """The files to query for rows whose `column = value` for any (column, values) of `probes`."""
    every = partitions(table_dir, first_day)
    try:
        hashed = [int(h) for c, vs in probes.items() for h in hashes(c, pa.array(list(vs), pa.string()))]
    except (UnicodeError, pa.ArrowException) as e:  # a value no file can hold as UTF-8: nothing is ruled out
        log.warning("lookup index not used: %s", e)
        return LookupPlan(tuple(every), tuple(Search(p, None) for p in every), len(every))
    by_day: dict[str, list[PartitionRef]] = defaultdict(list)
    for part in every:
        by_day[part.date].append(part)
    search, unindexed = [], 0
    for date, parts in sorted(by_day.items()):
        day = open_day(table_dir, date) if set(probes) <= set(LOOKUP_COLUMNS) else None
        try:
            for part in parts:
                live = live_files(part.dir) if day is not None else None
                if live is None:
                    unindexed += 1
                    search.append(Search(part, None))
                    continue
                files = []
                for rel, signature in live.items():
                    e = day.entries.get((part.importer, part.app_env, base_name(rel)))
                    if e is None or not e.describes(signature, probes):
                        unindexed += 1
                        files.append(rel)
                    elif any(may_hold(day.filter(e), h) for h in hashed):
                        files.append(rel)
                if files:
                    search.append(Search(part, _one_each(files)))
        finally:
            if day is not None:
                day.close()
    return LookupPlan(tuple(every), tuple(_unique_names(search)), unindexed)


def _one_each(files: list[str]) -> tuple[str, ...]:
    """One path of each name: a stray listed in the dir and in `_compacted-<gen>/` while being moved."""
    return tuple(sorted({base_name(rel): rel for rel in files}.values()))


def _unique_names(search: list[Search]) -> list[Search]:
    """`search` with a partition searched whole where one of its files' names is also another's: a row read by
    path is told its partition by its file's name (merges and importers name files by uuid: never, really)."""
    count: dict[str, int] = defaultdict(int)
    for s in search:
        for rel in s.files or ():
            count[base_name(rel)] += 1
    return [Search(s.part, None) if any(count[base_name(r)] > 1 for r in s.files or ()) else s for s in search]


def named_files(lookup: LookupPlan) -> dict[str, tuple[str, PartitionRef]]:
    """The files to read by path, by name: (path relative to its partition's dir, the partition)."""
    return {base_name(rel): (rel, s.part) for s in lookup.search for rel in s.files or ()}


def predicate(lookup: LookupPlan) -> str | None:
    """SQL over the partition columns selecting the partitions `lookup` searches whole (so that Spark lists
    only those), None when there are none; a day searched whole is named by its date alone."""
    whole = [s.part for s in lookup.search if s.files is None]
    if not whole:
        return None
    every_of: dict[str, int] = defaultdict(int)
    for p in lookup.every:
        every_of[p.date] += 1
    chosen: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for p in whole:
        chosen[p.date][p.importer].append(p.app_env)
    terms = []
    for date, importers in sorted(chosen.items()):
        if sum(len(v) for v in importers.values()) == every_of[date]:
            terms.append(f"date = DATE'{date}'")
            continue
        for importer, app_envs in sorted(importers.items()):
            names = ", ".join(f"'{sql_string(a)}'" for a in sorted(app_envs))
            terms.append(f"(date = DATE'{date}' AND importer = {int(importer)} AND app_env IN ({names}))")
    return "(" + " OR ".join(terms) + ")"
