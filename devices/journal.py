"""The device journal: every accepted message, with its sequence number, on disk.

The device appends each committed batch here after numbering it and before
publishing it or answering 202, so everything a client saw accepted can be replayed.

Layout: `<dir>/<first seq, 20 digits>.journal` segment files. Each holds whole
batches, one `write()` each:

    u32 body length | u32 crc32(body) | u64 first seq | u32 count | body
    body = count x (u16 app-env len | u16 topic len | u32 body len | app-env | topic | body | meta[24])

Sequence numbers are consecutive across the journal (heartbeats are journaled too),
so a batch header locates any sequence number. A crash can leave a torn last batch;
opening the journal truncates it (its messages were never published nor acknowledged,
because both happen after the append). Sequence numbers continue from the last whole
batch.

Fsync policies: `batch` (fsync every append: survives power loss), `interval` (fsync
at most every N ms: a power loss may lose the last N ms), `os` (leave it to the page
cache: survives a process kill, not a power loss). Retention deletes whole segments,
oldest first, by total size and by age; the active segment is never deleted.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import zlib
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from logjam.errors import RemoteProtocolError

log = logging.getLogger("logjam-device")

_BATCH = struct.Struct(">IIQI")
_RECORD = struct.Struct(">HHI")
META_SIZE = 24
SUFFIX = ".journal"
# Index one batch per this many bytes of a segment; reads scan forward from there.
INDEX_EVERY = 64 * 1024
FSYNC_POLICIES = ("batch", "interval", "os")


class JournalCorrupt(RemoteProtocolError):
    """A batch in the middle of the journal fails its checksum."""

    reason = "journal_corrupt"


@dataclass
class _Segment:
    path: Path
    first_seq: int
    last_seq: int  # first_seq - 1 while empty
    size: int
    mtime: float
    # Sparse index: (first seq of a batch, offset of its header), ascending.
    index: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Gone:
    """The requested sequence numbers were deleted by retention; the journal starts at `first_seq`."""

    first_seq: int


def _scan(path: Path) -> tuple[int, int, list[tuple[int, int]], int]:
    """Validate a segment: (first seq, last seq, sparse index, valid length)."""
    data = path.read_bytes()
    first = int(path.name[: -len(SUFFIX)])
    last = first - 1
    index: list[tuple[int, int]] = []
    pos = 0
    last_indexed = -INDEX_EVERY
    while pos + _BATCH.size <= len(data):
        length, crc, batch_first, count = _BATCH.unpack_from(data, pos)
        end = pos + _BATCH.size + length
        if end > len(data) or zlib.crc32(data[pos + _BATCH.size : end]) != crc or batch_first != last + 1:
            break
        if pos - last_indexed >= INDEX_EVERY:
            index.append((batch_first, pos))
            last_indexed = pos
        last = batch_first + count - 1
        pos = end
    return first, last, index, pos


class Journal:
    def __init__(
        self,
        directory: str | Path,
        *,
        fsync: str = "os",
        fsync_interval_ms: int = 100,
        segment_bytes: int = 64 * 1024 * 1024,
        retention_bytes: int | None = None,
        retention_s: float | None = None,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.fsync_interval = fsync_interval_ms / 1000
        self.segment_bytes = segment_bytes
        self.retention_bytes = retention_bytes
        self.retention_s = retention_s
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._fd = -1
        self._last_sync = time.monotonic()
        self._unsynced = False
        # Counters for the device's metrics.
        self.fsyncs = 0
        self.bytes_written = 0
        self.segments_deleted = 0
        self._open()

    # -- opening and recovery -------------------------------------------------------

    def _open(self) -> None:
        paths = sorted(p for p in self.dir.iterdir() if p.name.endswith(SUFFIX) and p.name[: -len(SUFFIX)].isdigit())
        for i, path in enumerate(paths):
            first, last, index, valid = _scan(path)
            size = path.stat().st_size
            if valid < size:
                if i != len(paths) - 1:
                    raise JournalCorrupt(f"{path}: bad batch at byte {valid} of {size}, before the last segment")
                # A torn tail: never published, never acknowledged.
                log.warning("journal: truncating %d bytes of a torn last batch at byte %d of %s", size - valid, valid, path)
                with open(path, "r+b") as f:
                    f.truncate(valid)
                size = valid
            self._segments.append(_Segment(path, first, last, size, path.stat().st_mtime, index))
        if not self._segments:
            self._roll(1)
        else:
            self._fd = os.open(self._segments[-1].path, os.O_WRONLY | os.O_APPEND)

    def _roll(self, first_seq: int) -> None:
        if self._fd >= 0:
            if self.fsync != "os":
                os.fsync(self._fd)
            os.close(self._fd)
        path = self.dir / f"{first_seq:020d}{SUFFIX}"
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        seg = _Segment(path, first_seq, first_seq - 1, 0, time.time())
        with self._lock:
            self._segments.append(seg)
        self._sync_dir()

    def _sync_dir(self) -> None:
        if self.fsync == "os":
            return
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- state ----------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """The highest journaled sequence number (0 for an empty journal)."""
        for seg in reversed(self._segments):
            if seg.last_seq >= seg.first_seq:
                return seg.last_seq
        return self._segments[0].first_seq - 1 if self._segments else 0

    @property
    def first_seq(self) -> int:
        return self._segments[0].first_seq

    @property
    def size(self) -> int:
        return sum(s.size for s in list(self._segments))

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    # -- writing --------------------------------------------------------------------

    def append(self, first_seq: int, records: Sequence[tuple[Any, Any, Any, bytes]]) -> None:
        """Append one batch: (app-env, topic, body, meta) with consecutive seqs from `first_seq`.

        Frames may be bytes, memoryviews or zmq.Frame objects (anything `bytes()` accepts).
        """
        if not records:
            return
        parts: list[Any] = []
        add = parts.append
        pack = _RECORD.pack
        for app, topic, body, meta in records:
            app_b, topic_b, body_b = bytes(app), bytes(topic), bytes(body)
            add(pack(len(app_b), len(topic_b), len(body_b)))
            add(app_b)
            add(topic_b)
            add(body_b)
            add(meta)
        self._write(first_seq, len(records), b"".join(parts))

    def append_encoded(self, first_seq: int, count: int, body: Any) -> None:
        """Append one batch whose body is already in the record format (see the module docstring).

        For the device's C engine, which serializes a whole batch in one call: `body` is any
        contiguous buffer (bytes, memoryview, a cffi buffer) holding `count` records with
        consecutive seqs from `first_seq`. It is written as is, without a copy.
        """
        if count <= 0:
            return
        self._write(first_seq, count, body)

    def _write(self, first_seq: int, count: int, payload: Any) -> None:
        seg = self._segments[-1]
        if first_seq != seg.last_seq + 1:
            raise ValueError(f"journal expects seq {seg.last_seq + 1}, got {first_seq}")
        if seg.size >= self.segment_bytes:
            self._roll(first_seq)
            seg = self._segments[-1]
        header = _BATCH.pack(len(payload), zlib.crc32(payload), first_seq, count)
        size = len(header) + len(payload)
        offset = seg.size
        # One writev per batch (no joined copy of a large payload). Readers only look up
        # to `seg.size`, which moves after the write.
        written = os.writev(self._fd, [header, payload])
        if written != size:
            # A short write to a regular file means a full disk. The partial batch is a
            # torn tail: the caller must stop (nothing of it was published or acknowledged),
            # and the next open truncates it.
            raise OSError(f"journal write of {size} bytes wrote only {written}")
        with self._lock:
            if offset - (seg.index[-1][1] if seg.index else -INDEX_EVERY) >= INDEX_EVERY:
                seg.index.append((first_seq, offset))
            seg.size += size
            seg.last_seq = first_seq + count - 1
            seg.mtime = time.time()
        self.bytes_written += size
        self._unsynced = True
        if self.fsync == "batch":
            self.sync()
        elif self.fsync == "interval" and time.monotonic() - self._last_sync >= self.fsync_interval:
            self.sync()

    def sync(self) -> None:
        if self._unsynced:
            os.fsync(self._fd)
            self.fsyncs += 1
            self._unsynced = False
        self._last_sync = time.monotonic()

    def tick(self) -> None:
        """Called periodically by the device: interval fsyncs and retention."""
        if self.fsync == "interval" and time.monotonic() - self._last_sync >= self.fsync_interval:
            self.sync()
        self.enforce_retention()

    def enforce_retention(self, now: float | None = None) -> int:
        """Delete old segments by size and age; returns how many were deleted."""
        now = time.time() if now is None else now
        deleted = 0
        while len(self._segments) > 1:
            oldest = self._segments[0]
            too_big = self.retention_bytes is not None and self.size > self.retention_bytes
            too_old = self.retention_s is not None and now - oldest.mtime > self.retention_s
            if not (too_big or too_old):
                break
            with self._lock:
                self._segments.pop(0)
            oldest.path.unlink(missing_ok=True)
            deleted += 1
            self.segments_deleted += 1
        return deleted

    def close(self) -> None:
        if self._fd >= 0:
            if self.fsync != "os":
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    # -- reading (safe from another thread) -------------------------------------------

    def read(self, from_seq: int, max_count: int = 1000, max_bytes: int = 4 * 1024 * 1024) -> list[tuple[bytes, bytes, bytes, bytes]] | Gone:
        """Messages from `from_seq` on, in order: at most `max_count`, stopping after `max_bytes`.

        Returns Gone when `from_seq` was deleted by retention, [] past the end.
        """
        with self._lock:
            segments = list(self._segments)
            if from_seq < segments[0].first_seq:
                return Gone(segments[0].first_seq)
            starts = [s.first_seq for s in segments]
            i = bisect_right(starts, from_seq) - 1
            seg = segments[i]
            if from_seq > seg.last_seq:
                return []
            index = list(seg.index)
            end = seg.size
        keys = [k for k, _ in index]
        j = bisect_right(keys, from_seq) - 1
        pos = index[j][1] if j >= 0 else 0
        out: list[tuple[bytes, bytes, bytes, bytes]] = []
        used = 0
        with open(seg.path, "rb") as f:
            f.seek(pos)
            while pos < end and len(out) < max_count and used < max_bytes:
                header = f.read(_BATCH.size)
                length, crc, batch_first, count = _BATCH.unpack(header)
                pos += _BATCH.size + length
                if batch_first + count - 1 < from_seq:
                    f.seek(pos)
                    continue
                payload = f.read(length)
                if zlib.crc32(payload) != crc:
                    raise JournalCorrupt(f"{seg.path}: bad batch at seq {batch_first}")
                p = 0
                for k in range(count):
                    a, t, b = _RECORD.unpack_from(payload, p)
                    p += _RECORD.size
                    app = payload[p : p + a]
                    p += a
                    topic = payload[p : p + t]
                    p += t
                    body = payload[p : p + b]
                    p += b
                    meta = payload[p : p + META_SIZE]
                    p += META_SIZE
                    if batch_first + k >= from_seq and len(out) < max_count:
                        out.append((app, topic, body, meta))
                        used += a + t + b + META_SIZE
        return out
