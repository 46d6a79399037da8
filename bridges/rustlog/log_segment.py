"""One segment file of the RustLog log: the record format, its sparse index, recovery.

A record on disk is a 24-byte header (crc32 of the rest, payload length, offset,
timestamp in microseconds) followed by the payload. The active segment is scanned
at open and cut at the first torn or corrupt record, so a crash in the middle of an
append loses only what was never acknowledged. Sealed segments are trusted; their
index is only a hint (reads scan forward from the nearest entry below the target).

log.py builds partitions and topics from these; it also re-exports the names here.
"""

from __future__ import annotations

import bisect
import errno
import os
import re
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from bridges.host.files import write_all
from runtime.config import FSYNC_POLICIES

HEADER = struct.Struct(">IIQQ")  # crc32, payload length, offset, timestamp µs
HEADER_SIZE = HEADER.size
INDEX_ENTRY = struct.Struct(">II")
WATERMARK = struct.Struct(">QQ")
_WATERMARK_CHECK = 0x5A5A_A5A5_5A5A_A5A5
_SEGMENT_NAME = re.compile(r"(\d{20})\.log\Z")


class LogError(Exception):
    """Base of the log's business errors (mapped to protocol errors by the bridge)."""


class StorageError(LogError):
    """The disk refused a write or read; `no_space` tells ENOSPC apart."""

    def __init__(self, message: str, *, no_space: bool = False) -> None:
        super().__init__(message)
        self.no_space = no_space


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 16 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_ms: int | None = None  # None keeps records forever
    retention_bytes: int | None = None  # per partition
    fsync: str = "always"  # always: before every acknowledgement; interval: by sync(); never: the OS decides
    max_partitions: int = 1000  # per topic (the spec's bound)
    # All topics together: a 30-byte CreateTopic makes 1,000 partitions (directories, files,
    # fsyncs), so without this a client could fill the disk's inodes with requests alone.
    max_total_partitions: int = 10_000

    def __post_init__(self) -> None:
        if self.fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {self.fsync!r}")
        if self.segment_bytes < HEADER_SIZE + 1:
            raise ValueError("segment_bytes is too small")


@dataclass(frozen=True, slots=True)
class StoredRecord:
    offset: int
    timestamp: int  # microseconds since the epoch
    payload: bytes


def now_us() -> int:
    return time.time_ns() // 1000


def _storage_error(action: str, e: OSError) -> StorageError:
    return StorageError(f"{action}: {e}", no_space=e.errno in (errno.ENOSPC, errno.EDQUOT))


class Segment:
    """One segment file and its sparse index; offsets [base, next_offset)."""

    def __init__(self, directory: Path, base: int, config: LogConfig) -> None:
        self.base = base
        self.config = config
        self.path = directory / f"{base:020d}.log"
        self.index_path = directory / f"{base:020d}.index"
        # Descriptors are opened on use and released when the segment is sealed or idle,
        # so that a thousand-partition topic does not hold thousands of files open.
        self._fd: int | None = None
        self._index_fd: int | None = None
        try:
            self.size = os.stat(self.path).st_size
        except FileNotFoundError:
            self.size = 0
            self.fd  # create it: an empty active segment still marks its base offset
        self.next_offset = base
        self.max_timestamp = 0
        self.index: list[tuple[int, int]] = []  # (offset, position), sorted
        self._since_index = 0

    @property
    def fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    @property
    def index_fd(self) -> int:
        if self._index_fd is None:
            self._index_fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._index_fd

    def release(self) -> None:
        """Close the descriptors; the next use opens them again."""
        for fd in (self._fd, self._index_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._index_fd = None

    # -- opening

    def load_index(self) -> None:
        raw = os.pread(self.index_fd, os.fstat(self.index_fd).st_size, 0)
        last_pos = -1
        for i in range(len(raw) // INDEX_ENTRY.size):
            rel, pos = INDEX_ENTRY.unpack_from(raw, i * INDEX_ENTRY.size)
            # Entries past the file or out of order come from a torn write; stop there.
            if pos <= last_pos or pos >= self.size:
                break
            self.index.append((self.base + rel, pos))
            last_pos = pos

    def recover(self, full: bool) -> int:
        """Find the valid end by scanning (from the last index entry unless `full`); returns bytes cut."""
        if full:
            self.index.clear()
            os.ftruncate(self.index_fd, 0)
            offset, pos = self.base, 0
        else:
            offset, pos = self.index[-1] if self.index else (self.base, 0)
        end = pos
        expected = offset
        for rec, rec_pos, rec_end in self._scan(pos):
            if rec.offset != expected:
                break
            if full:
                self._maybe_index(rec.offset, rec_pos, rec_end - rec_pos)
            self.max_timestamp = max(self.max_timestamp, rec.timestamp)
            expected = rec.offset + 1
            end = rec_end
        cut = self.size - end
        if cut:
            os.ftruncate(self.fd, end)
            self.size = end
        self.next_offset = expected
        return cut

    def _scan(self, pos: int, chunk: int = 1 << 20) -> Iterator[tuple[StoredRecord, int, int]]:
        """Valid records from `pos` to the first bad one (torn, corrupt, or past the end)."""
        buf = b""
        buf_pos = pos  # file position of buf[0]
        while True:
            i = pos - buf_pos
            if len(buf) - i < HEADER_SIZE:
                buf = buf[i:] + os.pread(self.fd, chunk, buf_pos + len(buf))
                buf_pos = pos
                i = 0
                if len(buf) < HEADER_SIZE:
                    return
            crc, length, offset, ts = HEADER.unpack_from(buf, i)
            end = i + HEADER_SIZE + length
            if pos + HEADER_SIZE + length > self.size:
                return
            if end > len(buf):
                buf = buf[i:] + os.pread(self.fd, end - len(buf), buf_pos + len(buf))
                buf_pos = pos
                i = 0
                end = HEADER_SIZE + length
                if end > len(buf):
                    return
            if zlib.crc32(memoryview(buf)[i + 4:end]) != crc:
                return
            yield StoredRecord(offset, ts, bytes(buf[i + HEADER_SIZE:end])), pos, pos + HEADER_SIZE + length
            pos += HEADER_SIZE + length

    # -- writing

    def _maybe_index(self, offset: int, pos: int, size: int) -> bytes:
        entry = b""
        if not self.index or self._since_index >= self.config.index_interval_bytes:
            self.index.append((offset, pos))
            entry = INDEX_ENTRY.pack(offset - self.base, pos)
            self._since_index = 0
            if entry:
                os.pwrite(self.index_fd, entry, (len(self.index) - 1) * INDEX_ENTRY.size)
        self._since_index += size
        return entry

    def append(self, records: Sequence[bytes], first_offset: int, timestamp: int) -> None:
        parts = []
        pos = self.size
        offset = first_offset
        crc32 = zlib.crc32
        before = self.state()
        try:
            for payload in records:
                body = struct.pack(">IQQ", len(payload), offset, timestamp)
                crc = crc32(payload, crc32(body))
                parts.append(struct.pack(">I", crc))
                parts.append(body)
                parts.append(payload)
                size = HEADER_SIZE + len(payload)
                self._maybe_index(offset, pos, size)
                pos += size
                offset += 1
            data = b"".join(parts)
            os.lseek(self.fd, self.size, os.SEEK_SET)
            write_all(self.fd, data)
        except OSError as e:
            # Leave no half-written batch behind: the next append starts at a record boundary.
            self.restore(before)
            raise _storage_error(f"writing {self.path}", e) from None
        self.size = pos
        self.next_offset = offset
        self.max_timestamp = max(self.max_timestamp, timestamp)

    def state(self) -> tuple[int, int, int, int, int]:
        """What `restore` needs to undo appends made after this call."""
        return self.size, self.next_offset, self.max_timestamp, len(self.index), self._since_index

    def restore(self, state: tuple[int, int, int, int, int]) -> None:
        self.size, self.next_offset, self.max_timestamp, n_index, self._since_index = state
        del self.index[n_index:]
        try:
            os.ftruncate(self.fd, self.size)
        except OSError:
            pass  # writes go to `size` (pwrite position), and open cuts what follows the last good record

    def sync(self) -> None:
        # Writes only ever go through open descriptors, and release() follows a sync.
        for fd in (self._fd, self._index_fd):
            if fd is not None:
                os.fsync(fd)

    # -- reading

    def read(self, offset: int, max_bytes: int, out: list[StoredRecord], budget: int) -> int:
        """Append records from `offset` on to `out`; returns the budget left (soft limit)."""
        i = bisect.bisect_right(self.index, (offset, 1 << 62)) - 1
        pos = self.index[i][1] if i >= 0 else 0
        # Read about what the answer needs plus the distance from the index entry, in one go.
        chunk = min(max(budget + self.config.index_interval_bytes + HEADER_SIZE, 1 << 16), 8 << 20)
        for rec, _, _ in self._scan(pos, chunk):
            if rec.offset >= self.next_offset:
                break
            if rec.offset < offset:
                continue
            size = HEADER_SIZE + len(rec.payload)
            if out and size > budget:
                return 0
            out.append(rec)
            budget -= size
            if budget <= 0:
                return 0
        return budget

    def close(self) -> None:
        self.release()

    def delete(self) -> None:
        self.release()
        for p in (self.path, self.index_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
