"""The lookup index: which partitions of a closed day may hold one request id, trace id or event id.

A lookup of one id across a month (`logjam-sql --trace`, tools/trace.py) would otherwise have
Spark open every file's footer and bloom filters, about 1,200 files for 30 days of 40
streams: seconds on a small machine. The index answers first which partitions can hold the
id, so Spark plans only those (docs/schema.md, "The lookup index").

- **What**: per closed day one file, `<table>/_lookup/date=<YYYY-MM-DD>.idx` (a name
  starting with `_`, which no Spark reader of the table lists), holding per partition
  `(importer, app_env)` a split-block bloom filter of the values of LOOKUP_COLUMNS in its
  files, each value tagged with its column, and the names of the live files it was built
  from. A probe reads one 32-byte block of each filter through mmap: a few pages a day.
- **No false negatives**: a partition is left out of a lookup only when its live files now
  are exactly those its filter was built from and the filter says no. Files placed late
  into a closed day, a merge, retention, a torn marker, a day's file that does not parse:
  each makes the partition (or the day) unindexed, and an unindexed partition is queried.
  Open days are never indexed.
- **When**: `refresh` after a maintenance pass (warehouse/maintenance.py), under the table's
  compaction lock: it rebuilds a closed day's file when any of its partitions changed,
  reusing the filters of those that did not, and removes the files of days retention took.
  A file is replaced with runtime/durable.py's `replace_file`: a kill leaves the old or new.

Why a filter of our own and not a package's: a probe must touch one block of a filter
lying in a shared mmap, and the hash must stay the same across versions and processes
(persisted). The filter is Parquet's split-block bloom filter (8 salted bits in one 256-bit
block); its hash is 64-bit FNV-1a, computed for a whole column at once with numpy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import struct
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logjam.errors import CorruptStore
from runtime.durable import fsync_dir, replace_file
from table.layout import LOOKUP_COLUMNS
from table.marker import MARKER, TornMarker, read_marker
from table.partition_files import importer_roots
from table.paths import NAME_FILE, unescape_partition_value
from table.protocol import DROPPING, PartitionRef
from table.schema import sql_string

log = logging.getLogger(__name__)

INDEX_DIR = "_lookup"
SUFFIX = ".idx"
MAGIC = b"LJLKIDX1"
_PREFIX = struct.Struct("<8sII")  # magic, header length, header CRC-32
HASH = "fnv1a64-sbbf"  # named in each file: a file of another hash is not read
BLOCK = 32  # bytes of one split block: 8 little-endian 32-bit words
# About 0.1% false positives (Parquet's table for split-block filters: 16.9 bits a value):
# a lookup probes one filter per partition, ~1,200 in a month of 40 streams, so about one
# partition in a month is queried for nothing.
BITS_PER_VALUE = 17
SALTS = np.array([0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D,
                  0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31], dtype=np.uint64)
_FNV_BASIS, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)
_M32 = np.uint64(0xFFFFFFFF)


class TornIndex(CorruptStore):
    """A day's index file that does not parse: the day is searched as if unindexed."""


# -- hashing and the filter ------------------------------------------------------------------------------------------

def hashes(column: str, values: pa.Array) -> np.ndarray:
    """64-bit FNV-1a of `<column>\\0<value>` for each non-null value (finalised with a multiply-xorshift
    mix), byte position by byte position over the whole column at once."""
    arr = pc.drop_null(values).cast(pa.large_binary())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    h = np.full(n, _tag_basis(column), dtype=np.uint64)
    if n:
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int64)[arr.offset: arr.offset + n + 1]
        data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        lengths = offsets[1:] - offsets[:-1]
        order = np.argsort(-lengths, kind="stable")  # longest first: byte j's values are a prefix
        starts, lengths = offsets[:-1][order], lengths[order]
        h = h[order]
        longest = int(lengths[0])
        # How many values are longer than j, for each j: -lengths ascends.
        counts = np.searchsorted(-lengths, -np.arange(longest), side="left")
        for j in range(longest):
            k = int(counts[j])
            h[:k] = (h[:k] ^ data[starts[:k] + j].astype(np.uint64)) * _FNV_PRIME
    return _mix(h)


def _tag_basis(column: str) -> np.uint64:
    h = int(_FNV_BASIS)
    for b in column.encode() + b"\0":
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return np.uint64(h)


def _mix(h: np.ndarray) -> np.ndarray:
    """A 64-bit finaliser (splitmix64's): FNV's low bits alone spread short hex ids poorly."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _blocks_for(distinct: int) -> int:
    return max(1, -(-distinct * BITS_PER_VALUE // (BLOCK * 8)))


def build_filter(hashed: Sequence[np.ndarray]) -> bytes:
    """A split-block bloom filter holding every hash of `hashed`, sized for their number."""
    h = np.concatenate(hashed) if hashed else np.zeros(0, np.uint64)
    nblocks = _blocks_for(len(h))
    bits = np.zeros(nblocks * BLOCK * 8, dtype=bool)
    if len(h):
        block = ((h >> np.uint64(32)) * np.uint64(nblocks)) >> np.uint64(32)
        low = h & _M32
        for i, salt in enumerate(SALTS):
            shift = ((low * salt) & _M32) >> np.uint64(27)
            bits[(block * np.uint64(256) + np.uint64(32 * i) + shift).astype(np.int64)] = True
    return np.packbits(bits, bitorder="little").tobytes()


def may_hold(filt: memoryview | bytes, h: int) -> bool:
    """Whether a filter may hold the value of hash `h` (reads one block of it)."""
    nblocks = len(filt) // BLOCK
    block = ((h >> 32) * nblocks) >> 32
    words = struct.unpack_from("<8I", filt, block * BLOCK)
    low = h & 0xFFFFFFFF
    return all(w >> ((((low * int(salt)) & 0xFFFFFFFF) >> 27)) & 1 for w, salt in zip(words, SALTS))


# -- a day's file ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Entry:
    """One partition's filter in a day's file: the files it was built from, where its bits lie."""

    importer: int
    app_env: str
    files: tuple[str, ...]
    columns: tuple[str, ...]
    offset: int
    size: int


def index_path(table_dir: Path, date: str) -> Path:
    return table_dir / INDEX_DIR / f"date={date}{SUFFIX}"


def _body_start(header_length: int) -> int:
    """Where the filters begin: after the prefix and the header, at a block boundary."""
    return -(-(_PREFIX.size + header_length) // BLOCK) * BLOCK


def encode_day(date: str, filters: Sequence[tuple[int, str, tuple[str, ...], tuple[str, ...], bytes]]) -> bytes:
    """The bytes of a day's file: prefix, header (JSON, CRC-checked), then each filter block-aligned."""
    entries, offset = [], 0
    for importer, app_env, files, columns, bits in filters:
        entries.append({"importer": importer, "app_env": app_env, "files": list(files), "columns": list(columns),
                        "offset": offset, "size": len(bits)})
        offset += len(bits)
    header = {"date": date, "hash": HASH, "bits_per_value": BITS_PER_VALUE, "parts": entries}
    raw = json.dumps(header, separators=(",", ":")).encode()
    prefix = _PREFIX.pack(MAGIC, len(raw), zlib.crc32(raw))
    pad = b"\0" * (_body_start(len(raw)) - len(prefix) - len(raw))
    return b"".join([prefix, raw, pad, *(f[4] for f in filters)])


class DayIndex:
    """A day's file, mapped: its entries by (importer, app_env), probed without reading the filters whole."""

    def __init__(self, path: Path) -> None:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _PREFIX.size:
                raise TornIndex(f"{path}: {size} bytes")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            magic, length, crc = _PREFIX.unpack_from(self._map, 0)
            raw = self._map[_PREFIX.size: _PREFIX.size + length]
            if magic != MAGIC or len(raw) != length or zlib.crc32(raw) != crc:
                raise TornIndex(f"{path}: not an index, or torn")
            header = json.loads(raw)
            start = _body_start(length)
            expected = start + sum(int(p["size"]) for p in header["parts"])
            if header.get("hash") != HASH or expected != size:  # a file cut short, or of another hash
                raise TornIndex(f"{path}: hash {header.get('hash')!r}, {size} bytes of {expected}")
            self.entries = {(int(p["importer"]), str(p["app_env"])): Entry(
                int(p["importer"]), str(p["app_env"]), tuple(p["files"]), tuple(p["columns"]),
                start + int(p["offset"]), int(p["size"])) for p in header["parts"]}
        except TornIndex:
            self.close()
            raise
        except (ValueError, TypeError, KeyError, struct.error) as e:
            self.close()
            raise TornIndex(f"{path}: {e}") from e
        self._view = memoryview(self._map)

    def filter(self, entry: Entry) -> memoryview:
        return self._view[entry.offset: entry.offset + entry.size]

    def raw(self, entry: Entry) -> bytes:
        return bytes(self.filter(entry))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._view.release()
        with contextlib.suppress(Exception):
            self._map.close()


def open_day(table_dir: Path, date: str) -> DayIndex | None:
    """The day's index, or None when it has none or it does not parse (logged: the day is then searched whole)."""
    path = index_path(table_dir, date)
    try:
        return DayIndex(path)
    except FileNotFoundError:
        return None
    except (TornIndex, OSError, ValueError) as e:
        log.warning("lookup index %s ignored (its day is searched whole): %s", path, e)
        return None


# -- the live files of a partition -----------------------------------------------------------------------------------

def live_set(pdir: Path) -> tuple[str, ...] | None:
    """The data files a reader of the partition sees now, and the strays about to join them, relative
    to its dir; None when that is not known without the lock (a swap under way, a torn marker, a drop).

    Listed with os.scandir, not table/partition_files.py's pathlib walk: a lookup lists every
    partition of a month (1,200 dirs), and pathlib's stat per entry was 0.15 s of it. The rule
    is that module's: names starting with `_` or `.` are not data."""
    try:
        names = _data_names(pdir)
    except FileNotFoundError:
        return None
    if DROPPING in names:
        return None
    try:
        marker = read_marker(pdir) if MARKER in names else None
    except TornMarker:
        return None
    files = [n for n, is_file in names.items() if is_file and not n.startswith(("_", "."))]
    if marker is None:
        return None if (pdir / MARKER).exists() else tuple(sorted(files))  # a swap began meanwhile
    if marker.state != "done":
        return None
    loc = marker.location
    try:
        inside = _data_names(pdir / loc)
    except FileNotFoundError:
        return None
    live = [f"{loc}/{n}" for n, is_file in inside.items() if is_file and not n.startswith(("_", "."))]
    return tuple(sorted(live + [n for n in files if n not in marker.retire]))


def _data_names(directory: Path) -> dict[str, bool]:
    """Every name in `directory`, and whether it is a regular file (from the directory entry's type)."""
    with os.scandir(directory) as entries:
        return {e.name: e.is_file() for e in entries}


def partitions(table_dir: Path, first_day: str | None = None) -> list[PartitionRef]:
    """The table's partitions from `first_day` on (table/protocol.py's local_partitions, with os.scandir and
    days before `first_day` skipped by name: a lookup walks them all)."""
    found = []
    for importer, root in importer_roots(table_dir):
        try:
            apps = sorted(e.name for e in os.scandir(root) if e.name.startswith("app_env=") and e.is_dir())
        except FileNotFoundError:
            continue
        for app in apps:
            app_dir = root / app
            try:
                value = (app_dir / NAME_FILE).read_bytes().decode("utf-8", "surrogateescape")
            except FileNotFoundError:
                value = unescape_partition_value(app[len("app_env="):])
            try:
                dates = sorted(e.name[len("date="):] for e in os.scandir(app_dir)
                               if e.name.startswith("date=") and e.is_dir())
            except FileNotFoundError:
                continue
            found += [PartitionRef(importer, value, d, app_dir / f"date={d}", root) for d in dates
                      if first_day is None or d >= first_day]
    return found


# -- building: a maintenance pass's refresh ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Refreshed:
    """What one refresh did: days whose file it wrote, partitions whose filter it built or kept, bytes written."""

    days: int = 0
    built: int = 0
    reused: int = 0
    bytes: int = 0
    seconds: float = 0.0


def refresh(table_dir: Path, closed: Callable[[str], bool], *, fsync: str = "always",
            force: bool = False) -> Refreshed:
    """Bring every closed day's file up to date with its partitions' live files; remove the files of days
    no partition has any more (retention) and temporary files a killed write left. The caller holds the
    table's compaction lock, so that one writer at a time replaces a day's file. `force`: rebuild every
    closed day's filters from its files (a benchmark's build time, a test)."""
    started = time.monotonic()
    by_day: dict[str, list[PartitionRef]] = defaultdict(list)
    for part in partitions(table_dir):
        by_day[part.date].append(part)
    _remove_orphans(table_dir, set(by_day))
    days = built = reused = written = 0
    for date in sorted(by_day):
        if not closed(date):
            continue
        done = _refresh_day(table_dir, date, by_day[date], fsync, force)
        if done is not None:
            days, built, reused, written = days + 1, built + done[0], reused + done[1], written + done[2]
    return Refreshed(days, built, reused, written, time.monotonic() - started)


def _remove_orphans(table_dir: Path, dates: set[str]) -> None:
    directory = table_dir / INDEX_DIR
    try:
        names = [p for p in directory.iterdir() if p.is_file()]
    except FileNotFoundError:
        return
    gone = [p for p in names if not p.name.endswith(SUFFIX)
            or p.name[len("date="): -len(SUFFIX)] not in dates]
    for path in gone:
        path.unlink(missing_ok=True)
    if gone:
        fsync_dir(directory)


def _refresh_day(table_dir: Path, date: str, parts: list[PartitionRef], fsync: str,
                 force: bool) -> tuple[int, int, int] | None:
    """Rewrite the day's file if a partition's live files differ from its entry; (built, reused, bytes) or None."""
    old = None if force else open_day(table_dir, date)
    try:
        current = sorted(((p.importer, p.app_env), p, live_set(p.dir)) for p in parts)
        entries = old.entries if old is not None else {}

        def fresh(key: tuple[int, str], live: tuple[str, ...]) -> bool:
            e = entries.get(key)
            return e is not None and e.files == live and e.columns == LOOKUP_COLUMNS
        if old is not None and all(fresh(key, live) for key, _, live in current if live is not None):
            return None
        filters, built, reused = [], 0, 0
        for key, part, live in current:
            if live is None:
                continue  # not known without the lock now: unindexed until a later pass
            if fresh(key, live):
                filters.append((*key, live, LOOKUP_COLUMNS, old.raw(entries[key])))
                reused += 1
                continue
            bits = _partition_filter(part.dir, live)
            if bits is not None:
                filters.append((*key, live, LOOKUP_COLUMNS, bits))
                built += 1
    finally:
        if old is not None:
            old.close()
    data = encode_day(date, filters)
    replace_file(index_path(table_dir, date), data, fsync=fsync)
    return built, reused, len(data)


def _partition_filter(pdir: Path, names: Iterable[str]) -> bytes | None:
    """The filter of every LOOKUP_COLUMNS value in the files `names` (relative to `pdir`), read column by
    column; None when one of them is gone (merged and deleted meanwhile: a later pass builds it)."""
    hashed: list[np.ndarray] = []
    try:
        for name in names:
            pf = pq.ParquetFile(pdir / name)
            columns = [c for c in LOOKUP_COLUMNS if c in pf.schema_arrow.names]
            for batch in pf.iter_batches(batch_size=1 << 18, columns=columns) if columns else ():
                for c in columns:
                    values = batch.column(c)
                    if pa.types.is_dictionary(values.type):
                        values = values.dictionary_decode()
                    hashed.append(hashes(c, values))
    except FileNotFoundError:
        return None
    return build_filter([np.unique(np.concatenate(hashed))] if hashed else [])


# -- a lookup's plan --------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LookupPlan:
    """Which partitions a lookup queries: every one from `first_day` on except those an up-to-date filter
    rules out. `days`: the distinct days of all of them, searched or ruled out."""

    every: tuple[PartitionRef, ...]
    search: tuple[PartitionRef, ...]
    unindexed: int

    @property
    def days(self) -> list[str]:
        return sorted({p.date for p in self.every})

    @property
    def ruled_out(self) -> int:
        return len(self.every) - len(self.search)


def plan(table_dir: Path, probes: Mapping[str, Sequence[str]], first_day: str | None = None) -> LookupPlan:
    """The partitions to query for rows whose `column = value` for any (column, values) of `probes`."""
    every = partitions(table_dir, first_day)
    try:
        hashed = {c: [int(h) for h in hashes(c, pa.array(list(vs), pa.string()))] for c, vs in probes.items()}
    except (UnicodeError, pa.ArrowException) as e:  # a value no file can hold as UTF-8: nothing is ruled out
        log.warning("lookup index not used: %s", e)
        return LookupPlan(tuple(every), tuple(every), len(every))
    by_day: dict[str, list[PartitionRef]] = defaultdict(list)
    for part in every:
        by_day[part.date].append(part)
    search, unindexed = [], 0
    for date, parts in sorted(by_day.items()):
        day = open_day(table_dir, date) if set(probes) <= set(LOOKUP_COLUMNS) else None
        try:
            for part in parts:
                entry = day.entries.get((part.importer, part.app_env)) if day is not None else None
                if entry is None or not set(probes) <= set(entry.columns) or entry.files != live_set(part.dir):
                    unindexed += 1
                    search.append(part)
                elif any(may_hold(day.filter(entry), h) for hs in hashed.values() for h in hs):
                    search.append(part)
        finally:
            if day is not None:
                day.close()
    return LookupPlan(tuple(every), tuple(search), unindexed)


def partition_predicate(lookup: LookupPlan) -> str | None:
    """SQL over the partition columns selecting `lookup.search` (so that Spark lists only those), None
    when that is every partition of the plan; a day searched whole is named by its date alone."""
    if len(lookup.search) == len(lookup.every):
        return None
    if not lookup.search:
        return "false"
    every_of: dict[str, int] = defaultdict(int)
    for p in lookup.every:
        every_of[p.date] += 1
    chosen: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for p in lookup.search:
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
