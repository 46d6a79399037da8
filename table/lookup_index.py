"""The lookup index: which files of the table may hold one request id, trace id or event id.

A lookup of one id across a month (`logjam-sql --trace`, tools/trace.py) would otherwise have
Spark open every file's footer and bloom filters, about 1,200 files for 30 days of 40
streams: seconds on a small machine. The index answers first which files can hold the id,
so Spark plans only those (docs/schema.md, "The lookup index"); table/lookup_plan.py is the
lookup's side.

- **What**: per day one file, `<table>/_lookup/date=<YYYY-MM-DD>.idx` (a name starting with
  `_`, which no Spark reader of the table lists), holding per data file of the day's
  partitions a split-block bloom filter of its values of LOOKUP_COLUMNS, each value tagged
  with its column, under the file's partition `(importer, app_env)`, name, size and mtime.
  A probe reads one 32-byte block of each filter through mmap: a few pages a day.
- **Per file, every day**: files never change once placed (an importer's, a merge's output;
  a merge replaces files by new ones with new names), so a file's filter, once built, stays
  true while a file of that name, size and mtime is live. A refresh hashes only the files it
  has no filter for: the open day, where the importers place files all day, is indexed too.
- **No false negatives**: a file is left out of a lookup only when a filter built from a
  file of its name, size and mtime says no. A file without one (placed after the last
  refresh, a merge's output not yet indexed) is searched; a partition whose live files are
  not known without the lock (a swap under way, a torn marker, a drop) is searched whole;
  a day's file that does not parse is ignored and the day searched whole.
- **When**: `refresh` after a maintenance pass (warehouse/maintenance.py), under the table's
  compaction lock: a day's file is rewritten when its live files differ from its entries,
  with the filters of the files still live kept, and removed when retention took the day.
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
from typing import Iterable, Mapping, Sequence

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

log = logging.getLogger(__name__)

INDEX_DIR = "_lookup"
SUFFIX = ".idx"
MAGIC = b"LJLKIDX2"  # 1 held a filter per partition
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


def distinct(h: np.ndarray) -> np.ndarray:
    """The distinct hashes, ascending: what `np.unique` returns, by a sort and one comparison. numpy 2.4's
    unique of 64-bit integers took 13x a sort's time (0.52 s against 0.04 s for 600,000: three columns of
    200,000 rows), most of the index's CPU."""
    h = np.sort(h)
    if len(h) > 1:
        h = h[np.concatenate(([True], h[1:] != h[:-1]))]
    return h


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

# A live file as a lookup sees it: its path relative to the partition's dir -> (size, mtime in ns).
Live = Mapping[str, tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Entry:
    """One data file's filter in a day's file: which file it was built from, the columns, where its bits lie."""

    importer: int
    app_env: str
    name: str  # the file's name (without its directory: a stray keeps it when moved into `_compacted-<gen>/`)
    file_size: int
    mtime_ns: int
    columns: tuple[str, ...]
    offset: int
    length: int

    @property
    def key(self) -> tuple[int, str, str]:
        return self.importer, self.app_env, self.name

    def describes(self, signature: tuple[int, int], columns: Iterable[str]) -> bool:
        """Whether this filter is the one of a live file of this name with `signature`, holding `columns`."""
        return (self.file_size, self.mtime_ns) == signature and set(columns) <= set(self.columns)


def index_path(table_dir: Path, date: str) -> Path:
    return table_dir / INDEX_DIR / f"date={date}{SUFFIX}"


def _body_start(header_length: int) -> int:
    """Where the filters begin: after the prefix and the header, at a block boundary."""
    return -(-(_PREFIX.size + header_length) // BLOCK) * BLOCK


def encode_day(date: str, filters: Sequence[tuple[Entry, bytes]]) -> bytes:
    """The bytes of a day's file: prefix, header (JSON, CRC-checked), then each filter block-aligned
    (the entries' offset and length are set here)."""
    entries, offset = [], 0
    for e, bits in filters:
        entries.append([e.importer, e.app_env, e.name, e.file_size, e.mtime_ns, list(e.columns), offset, len(bits)])
        offset += len(bits)
    header = {"date": date, "hash": HASH, "bits_per_value": BITS_PER_VALUE,
              "fields": ["importer", "app_env", "name", "file_size", "mtime_ns", "columns", "offset", "length"],
              "files": entries}
    raw = json.dumps(header, separators=(",", ":")).encode()
    prefix = _PREFIX.pack(MAGIC, len(raw), zlib.crc32(raw))
    pad = b"\0" * (_body_start(len(raw)) - len(prefix) - len(raw))
    return b"".join([prefix, raw, pad, *(bits for _, bits in filters)])


class DayIndex:
    """A day's file, mapped: its entries by (importer, app_env, name), probed without reading the filters whole."""

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
                raise TornIndex(f"{path}: not an index of this version, or torn")
            header = json.loads(raw)
            start = _body_start(length)
            expected = start + sum(int(e[7]) for e in header["files"])
            if header.get("hash") != HASH or expected != size:  # a file cut short, or of another hash
                raise TornIndex(f"{path}: hash {header.get('hash')!r}, {size} bytes of {expected}")
            entries = (Entry(int(i), str(a), str(n), int(s), int(m), tuple(c), start + int(o), int(n_))
                       for i, a, n, s, m, c, o, n_ in header["files"])
            self.entries = {e.key: e for e in entries}
        except TornIndex:
            self.close()
            raise
        except (ValueError, TypeError, KeyError, IndexError, struct.error) as e:
            self.close()
            raise TornIndex(f"{path}: {e}") from e
        self._view = memoryview(self._map)

    def filter(self, entry: Entry) -> memoryview:
        return self._view[entry.offset: entry.offset + entry.length]

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

def live_files(pdir: Path) -> dict[str, tuple[int, int]] | None:
    """The data files a reader of the partition sees now, and the strays about to join them (relative to its
    dir), each with its (size, mtime_ns); None when that is not known without the lock (a swap under way, a
    torn marker, a drop).

    Listed with os.scandir, not table/partition_files.py's pathlib walk: a lookup lists every
    partition of a month (1,200 dirs); one stat a data file (for its size and mtime). The rule
    is that module's: names starting with `_` or `.` are not data."""
    try:
        names = _listing(pdir)
    except FileNotFoundError:
        return None
    if DROPPING in names:
        return None
    try:
        marker = read_marker(pdir) if MARKER in names else None
    except TornMarker:
        return None
    if marker is None and (pdir / MARKER).exists():
        return None  # a swap began meanwhile
    if marker is not None and marker.state != "done":
        return None
    live = {}
    try:
        if marker is not None:
            live = {f"{marker.location}/{n}": _signature(e) for n, e in _listing(pdir / marker.location).items()
                    if _is_data(n, e)}
        live.update((n, _signature(e)) for n, e in names.items()
                    if _is_data(n, e) and (marker is None or n not in marker.retire))
    except FileNotFoundError:  # a file or the generation's dir deleted meanwhile: not known now
        return None
    return dict(sorted(live.items()))


def _listing(directory: Path) -> dict[str, os.DirEntry]:
    with os.scandir(directory) as entries:
        return {e.name: e for e in entries}


def _is_data(name: str, entry: os.DirEntry) -> bool:
    return not name.startswith(("_", ".")) and entry.is_file()


def _signature(entry: os.DirEntry) -> tuple[int, int]:
    st = entry.stat()
    return st.st_size, st.st_mtime_ns


def base_name(rel: str) -> str:
    return rel.rsplit("/", 1)[-1]


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
    """What one refresh did: days whose file it wrote, files whose filter it built or kept, bytes written."""

    days: int = 0
    built: int = 0
    reused: int = 0
    bytes: int = 0
    seconds: float = 0.0


def refresh(table_dir: Path, *, fsync: str = "always", force: bool = False) -> Refreshed:
    """Bring every day's file up to date with its partitions' live files, hashing only the files it has no
    filter for; remove the files of days no partition has any more (retention) and temporary files a
    killed write left. The caller holds the table's compaction lock, so that one writer at a time replaces
    a day's file. `force`: rebuild every filter from its file (a benchmark's build time, a test)."""
    started = time.monotonic()
    by_day: dict[str, list[PartitionRef]] = defaultdict(list)
    for part in partitions(table_dir):
        by_day[part.date].append(part)
    _remove_orphans(table_dir, set(by_day))
    days = built = reused = written = 0
    for date in sorted(by_day):
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
    """Rewrite the day's file if its live files differ from its entries; (built, reused, bytes) or None."""
    old = None if force else open_day(table_dir, date)
    entries = old.entries if old is not None else {}
    try:
        filters: list[tuple[Entry, bytes]] = []
        built = reused = 0
        for part in sorted(parts, key=lambda p: (p.importer, p.app_env)):
            live = live_files(part.dir)
            if live is None:  # not known without the lock now: its filters are kept for a later pass
                filters += [(e, old.raw(e)) for k, e in entries.items() if k[:2] == (part.importer, part.app_env)]
                continue
            names: set[str] = set()
            for rel, signature in live.items():
                if base_name(rel) in names:
                    continue  # a stray listed in the dir and in `_compacted-<gen>/` while being moved: one entry
                names.add(base_name(rel))
                e = entries.get((part.importer, part.app_env, base_name(rel)))
                if e is not None and e.describes(signature, LOOKUP_COLUMNS):
                    filters.append((e, old.raw(e)))
                    reused += 1
                    continue
                bits = _file_filter(part.dir / rel)
                if bits is not None:
                    filters.append((Entry(part.importer, part.app_env, base_name(rel), *signature, LOOKUP_COLUMNS,
                                          0, 0), bits))
                    built += 1
        if old is not None and not built and {e.key for e, _ in filters} == entries.keys():
            return None  # every filter kept, none dropped: the file is up to date
    finally:
        if old is not None:
            old.close()
    data = encode_day(date, filters)
    replace_file(index_path(table_dir, date), data, fsync=fsync)
    return built, reused, len(data)


def _file_filter(path: Path) -> bytes | None:
    """The filter of every LOOKUP_COLUMNS value in one data file, read column by column; None when it is gone
    (merged and deleted meanwhile) or does not read as Parquet: it is then searched, having no filter."""
    hashed: list[np.ndarray] = []
    try:
        pf = pq.ParquetFile(path)
        columns = [c for c in LOOKUP_COLUMNS if c in pf.schema_arrow.names]
        for batch in pf.iter_batches(batch_size=1 << 18, columns=columns) if columns else ():
            for c in columns:
                values = batch.column(c)
                if pa.types.is_dictionary(values.type):
                    values = values.dictionary_decode()
                hashed.append(hashes(c, values))
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException) as e:
        log.warning("lookup index: %s not indexed (searched by every lookup until merged): %s", path, e)
        return None
    return build_filter([distinct(np.concatenate(hashed))] if hashed else [])
