"""Which files of a partition compaction merges next: levels, so that a row is rewritten a bounded number of times.

Every file has a *level*: how many merges its rows have been through. An importer's file
is level 0; a merge of files up to level k writes level k+1 (the level is the file name's
`L<k>-` prefix). While a partition's day is open, a level holding `fanin` files is merged,
together with every smaller-level file, into one file of the next level, up to `max_level`.
So a row is rewritten at most `max_level` times during its day, and at most
`fanin - 1` files wait at each level. Files of `full_bytes` or more are never rewritten, and
while the day is open neither are an importer's own files of `open_full_bytes` or more: at a
high ingest rate they are that large already, few per hour, and rewriting them would take the
cores the importers need (measured: 16% fewer rows landed in benchmarks/e2e.py).

Once the day is closed (the importers have moved on), every small file that has not been
through the closing merge is merged into as few files of `target_bytes` as their size needs,
at the level `max_level + 1`: one more rewrite. A closed day that keeps receiving rows (a
backlog, a late shipper) gets a closing merge of its new files at every pass, and those
merged files are not rewritten again until `fanin` of them have gathered at one level, which
then merge into one level up: tiers again, so a row is rewritten O(log_fanin(passes)) times
however long the rows keep coming, instead of the whole day at every pass.

This is size-tiered compaction keyed on merge count instead of file size: Parquet sizes
shift with compression and load, merge counts do not, and the rewrite bound stays exact.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

TARGET_BYTES = 128 * 2**20
OPEN_FULL_BYTES = 8 * 2**20
FANIN = 10
MAX_LEVEL = 5

_LEVEL = re.compile(r"L(\d{1,3})-")


@dataclass(frozen=True, slots=True)
class FileInfo:
    name: str
    size: int

    @property
    def level(self) -> int:
        return level_of(self.name)


@dataclass(frozen=True, slots=True)
class Pick:
    """One merge: these files become `files` files of level `level`."""

    names: tuple[str, ...]
    level: int
    files: int
    bytes: int


def level_of(name: str) -> int:
    m = _LEVEL.match(name)
    return int(m.group(1)) if m else 0


def leveled_name(name: str, level: int) -> str:
    """The name a merged file of `level` gets (its Spark name, prefixed)."""
    m = _LEVEL.match(name)
    return f"L{level}-{name[m.end():] if m else name}"


@dataclass(frozen=True, slots=True)
class TierPolicy:
    target_bytes: int = TARGET_BYTES
    fanin: int = FANIN
    max_level: int = MAX_LEVEL
    open_full_bytes: int = OPEN_FULL_BYTES

    @property
    def full_bytes(self) -> int:
        return self.target_bytes * 3 // 4

    def pick(self, files: Sequence[FileInfo], *, closed: bool) -> Pick | None:
        """The next merge for a partition holding `files`, or None if it has as few as it should."""
        small = [f for f in files if f.size < self.full_bytes]
        if closed:
            return self._final(small)
        eligible = [f for f in small if f.level < self.max_level and (f.level or f.size < self.open_full_bytes)]
        for level in range(self.max_level - 1, -1, -1):
            if sum(1 for f in eligible if f.level == level) >= self.fanin:
                chosen = [f for f in eligible if f.level <= level]
                return self._pick(chosen, level + 1)
        return None

    def _final(self, small: list[FileInfo]) -> Pick | None:
        closing = self.max_level + 1
        merged = [f for f in small if f.level >= closing]
        for level in sorted({f.level for f in merged}, reverse=True):
            if sum(1 for f in merged if f.level == level) >= self.fanin:
                return self._pick([f for f in merged if f.level <= level], level + 1)
        fresh = [f for f in small if f.level < closing]
        if len(fresh) > max(1, math.ceil(sum(f.size for f in fresh) / self.target_bytes)):
            return self._pick(fresh, closing)
        return None

    def _pick(self, chosen: list[FileInfo], level: int) -> Pick:
        size = sum(f.size for f in chosen)
        return Pick(tuple(sorted(f.name for f in chosen)), level, max(1, math.ceil(size / self.target_bytes)), size)
