"""The RustLog log's record format, its configuration and its errors.

A record on disk is one frame of runtime/seglog.py's segmented-log engine: a 24-byte
header (crc32 of the rest of the record, payload length, offset, timestamp in
microseconds) followed by the payload. The engine owns the segment files
(`<base offset, 20 digits>.log`), their sparse index files (`<base>.index`: relative
offset u32, byte position u32), rolling, recovery and retention: the active segment is
scanned at open and cut at the first torn or corrupt record, so a crash in the middle of
an append loses only what was never acknowledged; sealed segments are trusted, their
index is only a hint (reads scan forward from the nearest entry below the target).

log.py builds partitions and topics on the engine; it also re-exports the names here.
"""

from __future__ import annotations

import errno
import struct
import time
from dataclasses import dataclass

from runtime.config import FSYNC_POLICIES
from runtime.seglog import INDEX_ENTRY, Framing  # noqa: F401 (INDEX_ENTRY: the index files are the engine's)

# crc32 of the rest, payload length, offset, timestamp µs; one record per offset.
FRAMING = Framing(">IIQQ", crc=0, length=1, covers_header=True, span=lambda f: (f[2], f[2] + 1))
HEADER = FRAMING.header
HEADER_SIZE = HEADER.size
WATERMARK = struct.Struct(">QQ")
_WATERMARK_CHECK = 0x5A5A_A5A5_5A5A_A5A5


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
