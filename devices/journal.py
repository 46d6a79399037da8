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

Identity: `<dir>/journal-id` holds 16 random hex digits, made (and fsynced) when the
journal is first opened and never changed for that directory. Sequence numbers are
only meaningful together with it: a wiped or replaced directory starts again at 1
under a new id, so a reader's checkpoint for the old id cannot swallow the new numbers.

Fsync policies: `batch` (fsync every append: survives power loss), `interval` (fsync
at most every N ms: a power loss may lose the last N ms), `os` (leave it to the page
cache: survives a process kill, not a power loss). Retention deletes whole segments,
oldest first, by total size and by age; the active segment is never deleted.

A write that fails (a full disk: ENOSPC, a file-size limit: EFBIG, an I/O error) raises
`JournalWriteError` after cutting the segment back to its last whole batch, so no torn
bytes stay behind and the same batch can be appended again later.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import struct
import threading
import time
import zlib
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from runtime.config import FSYNC_POLICIES
from logjam.errors import CorruptStore
from logjam.meta import META_SIZE

log = logging.getLogger("logjam-device")

_BATCH = struct.Struct(">IIQI")
_RECORD = struct.Struct(">HHI")
SUFFIX = ".journal"
# Index one batch per this many bytes of a segment; reads scan forward from there.
INDEX_EVERY = 64 * 1024
ID_FILE = "journal-id"
_ID = re.compile(r"[0-9a-f]{16}")


def new_journal_id() -> str:
    """16 random lowercase hex digits: a journal's identity (also a journal-less device's, per start)."""
    return secrets.token_hex(8)


class JournalCorrupt(CorruptStore):
    """A batch in the middle of the journal fails its checksum."""

    reason = "journal_corrupt"


class JournalWriteError(OSError):
    """An append failed (ENOSPC, EFBIG, EIO, ...); the journal holds nothing of the batch.

    `str()` reads `[Errno 28] No space left on device (<segment path>)`.
    """

    def __str__(self) -> str:
        return f"[Errno {self.errno}] {self.strerror} ({self.filename})"


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


def _write_all(fd: int, parts: list[Any]) -> None:
    """writev until every byte is written; a write error raises OSError with its errno."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        n = os.writev(fd, views)
        if n <= 0:
            raise OSError(errno.EIO, "journal write made no progress")
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    def __init__(
        self,
        directory: str | Path,
        *,
        fsync: str = "never",
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
        # A failed write whose bytes could not be cut off yet: cut them before the next one.
        self._torn = False
        self.journal_id = self._load_id()
        self._open()

    def _load_id(self) -> str:
        """This directory's journal id: read it, or make it (written and fsynced before any append)."""
        path = self.dir / ID_FILE
        try:
            text = path.read_text("ascii", "replace").strip()
        except FileNotFoundError:
            text = None
        if text is not None:
            if _ID.fullmatch(text):
                return text
            log.warning("journal: %s does not hold a journal id (%r); starting a new identity", path, text[:40])
        elif any(p.name.endswith(SUFFIX) for p in self.dir.iterdir()):
            log.info("journal: %s has segments but no id yet; giving it one", self.dir)
        journal_id = new_journal_id()
        tmp = self.dir / f"{ID_FILE}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, [f"{journal_id}\n".encode()])
            os.fsync(fd)  # whatever the policy: the id must outlive every batch written under it
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(self.dir)
        return journal_id

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
        # The new file first: if it cannot be made, the current segment stays the active one.
        path = self.dir / f"{first_seq:020d}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        old, self._fd = self._fd, fd
        with self._lock:
            self._segments.append(_Segment(path, first_seq, first_seq - 1, 0, time.time()))
        if old >= 0:
            try:
                if self.fsync != "never":
                    os.fsync(old)
            finally:
                os.close(old)
        self._sync_dir()

    def _sync_dir(self) -> None:
        if self.fsync != "never":
            _fsync_dir(self.dir)

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
        try:
            if self._torn:
                self._cut()
            if seg.size >= self.segment_bytes:
                self._roll(first_seq)
                seg = self._segments[-1]
            header = _BATCH.pack(len(payload), zlib.crc32(payload), first_seq, count)
            # One writev per batch (no joined copy of a large payload); after a short write
            # (the disk filled up) the rest is tried, which then names the error.
            _write_all(self._fd, [header, payload])
            sync_now = self.fsync == "always" or (
                self.fsync == "interval" and time.monotonic() - self._last_sync >= self.fsync_interval
            )
            if sync_now:
                self._unsynced = True
                self.sync()
        except OSError as e:
            # Nothing of this batch was published or acknowledged: cut it off, so that the
            # file ends with a whole batch and the caller can append the same batch later.
            self._torn = True
            self._cut(quiet=True)
            active = self._segments[-1].path
            raise JournalWriteError(e.errno or 0, e.strerror or str(e), str(active)) from e
        size = _BATCH.size + len(payload)
        offset = seg.size
        # Readers only look up to `seg.size`, which moves after the write.
        with self._lock:
            if offset - (seg.index[-1][1] if seg.index else -INDEX_EVERY) >= INDEX_EVERY:
                seg.index.append((first_seq, offset))
            seg.size += size
            seg.last_seq = first_seq + count - 1
            seg.mtime = time.time()
        self.bytes_written += size
        if not sync_now:
            self._unsynced = True

    def _cut(self, quiet: bool = False) -> None:
        """Truncate the active segment back to its last whole batch (after a failed write)."""
        seg = self._segments[-1]
        try:
            if os.fstat(self._fd).st_size != seg.size:
                os.ftruncate(self._fd, seg.size)
            self._torn = False
        except OSError:
            if not quiet:
                raise

    def sync(self) -> None:
        self._last_sync = time.monotonic()
        if self._unsynced:
            os.fsync(self._fd)
            self.fsyncs += 1
            self._unsynced = False

    def tick(self) -> bool:
        """Called periodically by the device: retention, and interval fsyncs.

        Returns whether it fsynced; a failed fsync raises JournalWriteError.
        """
        self.enforce_retention()
        if self.fsync == "interval" and time.monotonic() - self._last_sync >= self.fsync_interval:
            try:
                self.sync()
            except OSError as e:
                raise JournalWriteError(e.errno or 0, e.strerror or str(e), str(self._segments[-1].path)) from e
            return True
        return False

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
            try:
                if self.fsync != "never":
                    os.fsync(self._fd)
            except OSError as e:
                log.error("journal: fsync at close failed: %s (%s)", e, self._segments[-1].path)
            finally:
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
