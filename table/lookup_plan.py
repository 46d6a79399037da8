"""A lookup's plan: which files of which partitions may hold an id, by the lookup index (table/lookup_index.py).

tools/trace.py's `lookup` (behind `logjam-sql --trace`) asks `plan` before Spark plans, and
queries only what it leaves, naming those files (`predicate`): Spark then lists and opens
nothing else. A partition whose live files are not known (a swap under way, a torn marker, a
drop) or whose day's index does not parse is searched whole; a live file the index has no
filter for (placed since the last maintenance pass) is searched. Because the query names
files, a merge's swap between the plan and the query could hide the merged rows (the new
file's name was not named): `moved` tells the caller which partitions changed meanwhile, to
search them again whole.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pyarrow as pa

from table.layout import LOOKUP_COLUMNS
from table.lookup_index import base_name, hashes, live_files, may_hold, open_day, partitions
from table.protocol import PartitionRef
from table.schema import sql_string

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Search:
    """One partition to query: `files` (names) the only ones that may hold the id, or None: all of them."""

    part: PartitionRef
    files: tuple[str, ...] | None
    seen: frozenset[str] = frozenset()  # the names of the partition's live files when planned


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

    @property
    def ruled_out(self) -> int:
        return len(self.every) - len(self.search)

    def whole(self, parts: Sequence[PartitionRef]) -> LookupPlan:
        """This plan with `parts` searched whole."""
        keys = {_key(p) for p in parts}
        searched = {_key(s.part) for s in self.search}
        search = [replace(s, files=None) if _key(s.part) in keys else s for s in self.search]
        search += [Search(p, None) for p in parts if _key(p) not in searched]
        return replace(self, search=tuple(search))


def _key(p: PartitionRef) -> tuple[int, str, str]:
    return p.importer, p.app_env, p.date


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
                        files.append(base_name(rel))
                    elif any(may_hold(day.filter(e), h) for h in hashed):
                        files.append(base_name(rel))
                if files:
                    search.append(Search(part, tuple(sorted(set(files))), frozenset(base_name(r) for r in live)))
        finally:
            if day is not None:
                day.close()
    return LookupPlan(tuple(every), tuple(search), unindexed)


def moved(lookup: LookupPlan) -> list[PartitionRef]:
    """The partitions searched by file name whose live files' names are not those the plan saw any more (a
    swap, a late file): the query, naming the plan's files, may have missed rows moved into new ones."""
    changed = []
    for s in lookup.search:
        if s.files is not None:
            live = live_files(s.part.dir)
            if live is None or {base_name(r) for r in live} != s.seen:
                changed.append(s.part)
    return changed


def predicate(lookup: LookupPlan) -> str | None:
    """SQL over the partition columns and `_metadata.file_name` selecting `lookup.search` (so that Spark lists
    only those partitions and opens only those files), None when that is every file of every partition of
    the plan; a day searched whole is named by its date alone."""
    if not lookup.search:
        return "false"
    if len(lookup.search) == len(lookup.every) and all(s.files is None for s in lookup.search):
        return None
    every_of: dict[str, int] = defaultdict(int)
    for p in lookup.every:
        every_of[p.date] += 1
    chosen: dict[str, dict[int, list[Search]]] = defaultdict(lambda: defaultdict(list))
    for s in lookup.search:
        chosen[s.part.date][s.part.importer].append(s)
    terms = []
    for date, importers in sorted(chosen.items()):
        if sum(len(v) for v in importers.values()) == every_of[date] and all(
                s.files is None for v in importers.values() for s in v):
            terms.append(f"date = DATE'{date}'")
            continue
        for importer, searches in sorted(importers.items()):
            where = f"date = DATE'{date}' AND importer = {int(importer)}"
            whole = [s.part.app_env for s in searches if s.files is None]
            named = [s for s in searches if s.files is not None]
            if whole:
                terms.append(f"({where} AND app_env IN ({_strings(whole)}))")
            if named:
                files = sorted({f for s in named for f in s.files or ()})
                terms.append(f"({where} AND app_env IN ({_strings(s.part.app_env for s in named)}) "
                             f"AND _metadata.file_name IN ({_strings(files)}))")
    return "(" + " OR ".join(terms) + ")"


def _strings(values: Iterable[str]) -> str:
    return ", ".join(f"'{sql_string(v)}'" for v in sorted(set(values)))
