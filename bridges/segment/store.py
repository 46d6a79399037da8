"""The segment bridge's durable segment store: append-only segment files under --data-dir.

No sockets here. Layout, one directory per segment under `<data-dir>/segments/`:

- `name`: the segment's name (directory names are escaped or hashed).
- `data`: the segment's bytes exactly as Pravega stores them: the appended EVENT
  commands, headers included. ReadSegment serves these bytes.
- `index`: one 52-byte record per append: start and end offset, writer id, the
  writer's last event number after the append, the event count, a CRC-32 of the
  appended bytes, and a CRC-32 of the record itself. Writer state (writer id -> last
  event number) is rebuilt from it, so a reconnecting writer's AppendSetup tells the
  truth after a restart.
- `forwarded`: append-only 12-byte records (offset, CRC-32): the watermark up to which
  every event has been accepted by the Logjam device. Recovery forwards what lies
  between it and the end of the segment before the segment takes new writers.
- `sealed`: present once the segment is sealed.

The files are runtime/seglog.py's: `AppendFile`s (whole writes at the valid length, cut
back after a failure), with `index` and `forwarded` in the engine's CRC framing.

An append writes the data, then its index record. At open, index records are checked
in order (record CRC, contiguous offsets, data CRC); the first bad one and everything
after it is cut off, and the data file is truncated to the last good record, so a
crash mid-append leaves no torn or unindexed bytes. Such an append was never
acknowledged, and the writer resends it. An append that fails while running (a full
disk) is cut off at once and raises StoreError; the bridge tries it again later.

Fsync policy (`--fsync`): `always` fsyncs data, then index, before an append is
reported durable (concurrent appends share one fsync); `interval` fsyncs in the
background every `--fsync-interval` seconds, so an append is durable against a
process crash at once and against a machine crash within the interval; `never`
leaves it to the OS. The watermark file is never fsynced on the hot path: losing it
in a machine crash only means events are forwarded twice, never lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
import uuid
import zlib
from collections import deque
from pathlib import Path
from typing import Iterator, NamedTuple
from urllib.parse import quote

from bridges.host.files import store_id
from runtime.config import FSYNC_POLICIES
from runtime.durable import fsync_dir, replace_file
from runtime.seglog import AppendFile, Framing

log = logging.getLogger(__name__)

NULL_EVENT_NUMBER = -(2**63)

# start, end, writer, last event number, events, data crc, then the record's own crc.
INDEX = Framing(">QQ16sqiII", crc=6, covers_header=True, span=lambda f: (f[0], f[1]))
RECORD_SIZE = INDEX.size
MARK = Framing(">QI", crc=1, covers_header=True, span=lambda f: (f[0], f[0]))  # forwarded offset, crc
_MARK_COMPACT_AT = 64 * 1024


class StoreError(Exception):
    """The store could not do what was asked (I/O failure, bad name, ...)."""


class SegmentExists(StoreError):
    pass


class AppendRecord(NamedTuple):
    start: int
    end: int
    writer_id: uuid.UUID
    last_event_number: int
    num_events: int


def dir_name(segment: str) -> str:
    """A safe, unique directory name for a segment name (names may hold '/', '#', anything)."""
    escaped = quote(segment.encode("utf-8", "surrogatepass"), safe="")
    if len(escaped) <= 200:
        return "s_" + escaped
    return "h_" + hashlib.sha256(segment.encode("utf-8", "surrogatepass")).hexdigest()


class Segment:
    """One segment: its files, its writers, and the forwarding watermark."""

    def __init__(self, name: str, path: Path, fsync: str) -> None:
        self.name = name
        self.path = path
        self.fsync = fsync
        self._data = AppendFile(path / "data")
        self._index = AppendFile(path / "index")
        self._marks = AppendFile(path / "forwarded")
        self.length = 0
        self.writers: dict[uuid.UUID, int] = {}
        self.sealed = (path / "sealed").exists()
        records = self._recover()
        self.durable = self.length
        self.last_modified = int(os.fstat(self._data.fd).st_mtime * 1000)
        self.forwarded = min(self._read_mark(), self.length)
        # Appends not yet accepted by the device, in offset order: [record, done].
        self._pending: deque[list] = deque([r, False] for r in records if r.end > self.forwarded)
        self._sync_lock = asyncio.Lock()
        self._advanced: asyncio.Event | None = None

    # --- recovery ---------------------------------------------------------------------------

    def _recover(self) -> list[AppendRecord]:
        records: list[AppendRecord] = []
        data_size = self._data.size
        good = 0
        end = 0
        for (start, stop, writer, last, num, data_crc, _), _, _, record_end in INDEX.frames(self._index.read, 0, self._index.size):
            if start != end or stop < start or stop > data_size:
                break
            if zlib.crc32(self._data.read(stop - start, start)) != data_crc:
                break
            rec = AppendRecord(start, stop, uuid.UUID(bytes=writer), last, num)
            records.append(rec)
            self.writers[rec.writer_id] = last
            end = stop
            good = record_end
        if good != self._index.size:
            log.warning("segment %s: dropping %d bytes of torn index", self.name, self._index.size - good)
            self._index.truncate(good)
        if data_size != end:
            log.warning("segment %s: dropping %d unindexed bytes (an append that was never acknowledged)", self.name, data_size - end)
            self._data.truncate(end)
        self.length = end
        return records

    def _read_mark(self) -> int:
        mark = 0
        for (offset, _), _, _, _ in MARK.frames(self._marks.read, 0, self._marks.size):
            mark = offset
        return mark

    def unforwarded(self) -> list[AppendRecord]:
        """Stored appends the device has not accepted yet (after a crash), in order."""
        return [entry[0] for entry in self._pending if not entry[1]]

    # --- appends ----------------------------------------------------------------------------

    def last_event(self, writer_id: uuid.UUID) -> int:
        return self.writers.get(writer_id, NULL_EVENT_NUMBER)

    def append(self, writer_id: uuid.UUID, data: bytes, num_events: int, last_event_number: int) -> AppendRecord:
        """Write one append (data, then its index record) and return where it landed."""
        start = self.length
        rec = AppendRecord(start, start + len(data), writer_id, last_event_number, num_events)
        try:
            # Each file cuts back a failed write of its own (or before its next append); a failed
            # index record takes its data back too, so the files stay consistent with what we report.
            self._data.append([data])
            try:
                self._index.append([INDEX.encode(b"", rec.start, rec.end, writer_id.bytes, last_event_number,
                                                 num_events, zlib.crc32(data))])
            except OSError:
                self._data.rewind(start)
                raise
        except OSError as e:
            raise StoreError(f"segment {self.name}: append failed: {e}") from e
        self.length = rec.end
        self.writers[writer_id] = last_event_number
        self.last_modified = int(time.time() * 1000)
        self._pending.append([rec, False])
        if self.fsync != "always":
            self.durable = self.length
        return rec

    async def sync(self, end: int) -> None:
        """Return once bytes up to `end` are durable under the fsync policy (group commit)."""
        if self.durable >= end:
            return
        async with self._sync_lock:
            if self.durable >= end:
                return
            target = self.length
            await asyncio.to_thread(self._fsync_files)
            self.durable = max(self.durable, target)

    def _fsync_files(self) -> None:
        self._data.sync()
        self._index.sync()

    async def flush(self) -> None:
        """Fsync now (used by the interval policy and at shutdown)."""
        async with self._sync_lock:
            target = self.length
            await asyncio.to_thread(self._fsync_files)
            self.durable = max(self.durable, target)

    # --- forwarding watermark -----------------------------------------------------------------

    def mark_forwarded(self, rec: AppendRecord) -> None:
        """The device accepted every event of `rec`; advance the watermark over the done prefix."""
        for entry in self._pending:
            if entry[0] is rec:
                entry[1] = True
                break
        advanced = False
        while self._pending and self._pending[0][1]:
            self.forwarded = self._pending.popleft()[0].end
            advanced = True
        if advanced:
            self._write_mark()
            if self._advanced is not None:
                self._advanced.set()
                self._advanced = None

    def _write_mark(self) -> None:
        mark = MARK.encode(b"", self.forwarded)
        try:
            if self._marks.size >= _MARK_COMPACT_AT:
                # Never fsynced (see the module docstring): a lost mark only re-forwards.
                replace_file(self._marks.path, mark, fsync="never")
                self._marks.release()
                self._marks = AppendFile(self._marks.path)
            else:
                self._marks.append([mark])
        except OSError as e:
            # Only costs re-forwarding after a crash; keep serving.
            log.error("segment %s: cannot record the forwarded watermark: %s", self.name, e)

    async def wait_forwarded(self, offset: int) -> None:
        """Return once every event before `offset` has been accepted by the device."""
        while self.forwarded < offset:
            if self._advanced is None:
                self._advanced = asyncio.Event()
            await self._advanced.wait()

    # --- reads and sealing -----------------------------------------------------------------------

    def read(self, offset: int, max_length: int) -> tuple[bytes, bool, bool]:
        """(data, at_tail, end_of_segment) for a read at `offset`; only durable bytes are served."""
        visible = self.durable
        n = max(0, min(max_length, visible - offset))
        data = self._data.read(n, offset) if n else b""
        at_tail = offset + len(data) >= visible
        end_of_segment = self.sealed and offset + len(data) >= self.length
        return data, at_tail, end_of_segment

    def seal(self) -> None:
        if not self.sealed:
            (self.path / "sealed").touch()
            fsync_dir(self.path)
            self.sealed = True

    def close(self) -> None:
        for f in (self._data, self._index, self._marks):
            try:
                if self.fsync != "never":
                    f.sync()
            except OSError:
                pass
            f.release()


class SegmentStore:
    """Every segment under one data directory."""

    def __init__(self, root: Path | str, fsync: str = "always") -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}, not {fsync!r}")
        self.root = Path(root)
        self.fsync = fsync
        self.segments: dict[str, Segment] = {}
        self._dir = self.root / "segments"
        self.id = ""

    def open(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        self.id = store_id(self.root)
        for path in sorted(self._dir.iterdir()):
            if not path.is_dir() or path.name.endswith(".tmp"):
                continue
            try:
                name = (path / "name").read_bytes().decode("utf-8", "surrogatepass")
            except OSError:
                log.warning("skipping %s: no name file", path)
                continue
            self.segments[name] = Segment(name, path, self.fsync)

    def __iter__(self) -> Iterator[Segment]:
        return iter(list(self.segments.values()))

    def get(self, name: str) -> Segment | None:
        return self.segments.get(name)

    def create(self, name: str) -> Segment:
        if name in self.segments:
            raise SegmentExists(name)
        final = self._dir / dir_name(name)
        tmp = self._dir / (final.name + ".tmp")
        try:
            tmp.mkdir(exist_ok=True)
            (tmp / "name").write_bytes(name.encode("utf-8", "surrogatepass"))
            if self.fsync != "never":
                fsync_dir(tmp)
            os.replace(tmp, final)
            if self.fsync != "never":
                fsync_dir(self._dir)
        except OSError as e:
            raise StoreError(f"cannot create segment {name!r}: {e}") from e
        try:
            seg = Segment(name, final, self.fsync)
        except OSError as e:  # e.g. out of file descriptors
            raise StoreError(f"cannot open segment {name!r}: {e}") from e
        self.segments[name] = seg
        return seg

    async def flush(self) -> None:
        for seg in self:
            await seg.flush()

    def close(self) -> None:
        for seg in self:
            seg.close()
        self.segments.clear()
