"""The RustLog bridge's durable partitioned log: topics, segment files, offsets, retention.

Layout under the data directory::

    topics/<topic>/topic.json                  {"partition_count": N}
    topics/<topic>/<partition>/<base>.log      segment: records with consecutive offsets
    topics/<topic>/<partition>/<base>.index    sparse index: (relative offset u32, position u32)
    topics/<topic>/<partition>/forwarded       how far the device has accepted this partition
    offsets.log                                committed group offsets, one JSON line each

A record on disk is a 24-byte header (crc32 of the rest, payload length, offset,
timestamp in microseconds) followed by the payload. The active segment is scanned
at open and cut at the first torn or corrupt record, so a crash in the middle of an
append loses only what was never acknowledged. Sealed segments are trusted; their
index is only a hint (reads scan forward from the nearest entry below the target).

No sockets here, and no asyncio: the bridge calls these methods from its event loop.
"""

from __future__ import annotations

import bisect
import errno
import json
import os
import re
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from bridges.host.files import fsync_dir, store_id, write_all
from runtime.config import FSYNC_POLICIES

HEADER = struct.Struct(">IIQQ")  # crc32, payload length, offset, timestamp µs
HEADER_SIZE = HEADER.size
INDEX_ENTRY = struct.Struct(">II")
WATERMARK = struct.Struct(">QQ")
_WATERMARK_CHECK = 0x5A5A_A5A5_5A5A_A5A5
_SEGMENT_NAME = re.compile(r"(\d{20})\.log\Z")


class LogError(Exception):
    """Base of the log's business errors (mapped to protocol errors by the bridge)."""


class TopicNotFound(LogError):
    pass


class PartitionNotFound(LogError):
    pass


class TopicExists(LogError):
    pass


class BadPartitionCount(LogError):
    pass


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


class PartitionLog:
    """One topic-partition: an ordered list of segments, the last one active."""

    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.dir = directory
        self.config = config
        directory.mkdir(parents=True, exist_ok=True)
        bases = sorted(int(m.group(1)) for p in directory.iterdir() if (m := _SEGMENT_NAME.match(p.name)))
        self.segments: list[Segment] = []
        for i, base in enumerate(bases):
            seg = Segment(directory, base, config)
            last = i == len(bases) - 1
            if last:
                seg.recover(full=True)
            else:
                seg.load_index()
                seg.recover(full=False)
                seg.next_offset = bases[i + 1]
            seg.release()
            self.segments.append(seg)
        if not self.segments:
            self.segments.append(Segment(directory, 0, config))
            self.segments[-1].release()
            if config.fsync != "never":
                fsync_dir(directory)
        self._wm_path = directory / "forwarded"
        self._forwarded = self._read_watermark()
        self._dirty = False

    # -- positions

    @property
    def high_watermark(self) -> int:
        return self.segments[-1].next_offset

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].base

    @property
    def segment_count(self) -> int:
        return len(self.segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -- the forwarded watermark (see docs/protocols/rustlog.md, "Crash between log and device")

    def _read_watermark(self) -> int:
        try:
            raw = self._wm_path.read_bytes()
        except FileNotFoundError:
            raw = b""
        if len(raw) == WATERMARK.size:
            value, check = WATERMARK.unpack(raw)
            if check == value ^ _WATERMARK_CHECK and value <= self.high_watermark:
                return value
        # Unknown or torn: assume nothing was forwarded (duplicates beat losses).
        return self.log_start_offset if raw else 0

    @property
    def forwarded(self) -> int:
        return max(self._forwarded, self.log_start_offset)

    def set_forwarded(self, offset: int) -> None:
        """Everything below `offset` was accepted by the device."""
        if offset <= self._forwarded:
            return
        self._forwarded = offset
        # One 16-byte write inside one sector; a lost or torn one only causes re-forwarding.
        fd = os.open(self._wm_path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, WATERMARK.pack(offset, offset ^ _WATERMARK_CHECK), 0)
        except OSError as e:
            raise _storage_error(f"writing {self._wm_path}", e) from None
        finally:
            os.close(fd)

    # -- appending and reading

    def append(self, records: Sequence[bytes], timestamp: int | None = None, *, sync: bool = True) -> int:
        """Append durably (per the fsync policy); returns the first record's offset.

        With `sync=False` the caller takes over the "always" policy's fsync: it calls
        `sync()` itself (in a thread, while the records travel on) before it acknowledges.
        All or nothing: if any write fails (a full disk), the partition is put back as it
        was, segments this call rolled included, and StorageError is raised.
        """
        ts = now_us() if timestamp is None else timestamp
        base = self.high_watermark
        offset = base
        batch: list[bytes] = []
        batch_bytes = 0
        limit = self.config.segment_bytes
        before = (len(self.segments), self.segments[-1].state())
        try:
            for payload in records:
                size = HEADER_SIZE + len(payload)
                active = self.segments[-1]
                if active.size + batch_bytes + size > limit and (active.size + batch_bytes) > 0:
                    if batch:
                        active.append(batch, offset, ts)
                        offset += len(batch)
                        batch, batch_bytes = [], 0
                    self._roll()
                batch.append(payload)
                batch_bytes += size
            if batch:
                self.segments[-1].append(batch, offset, ts)
            self._dirty = True
            if sync and self.config.fsync == "always":
                self.sync()
        except (OSError, StorageError) as e:
            self._undo(*before)
            if isinstance(e, StorageError):
                raise
            raise _storage_error(f"appending in {self.dir}", e) from None
        return base

    def _undo(self, count: int, state: tuple[int, int, int, int, int]) -> None:
        """Back to `count` segments, the last one as `state` says (after a failed append)."""
        while len(self.segments) > count:
            self.segments.pop().delete()
        self.segments[-1].restore(state)

    def _roll(self) -> None:
        """Seal the active segment (synced unless fsync is never) and start the next one."""
        old = self.segments[-1]
        if self.config.fsync != "never":
            old.sync()
        old.release()
        seg = Segment(self.dir, self.high_watermark, self.config)
        self.segments.append(seg)
        if self.config.fsync != "never":
            fsync_dir(self.dir)

    def sync(self) -> None:
        if self._dirty:
            try:
                self.segments[-1].sync()
            except OSError as e:
                raise _storage_error(f"fsync in {self.dir}", e) from None
            self._dirty = False

    def read(self, offset: int, max_bytes: int) -> list[StoredRecord]:
        """Records from `offset` (must be within [log_start, high_watermark]); at least one if any."""
        out: list[StoredRecord] = []
        budget = max(max_bytes, 1)
        i = bisect.bisect_right([s.base for s in self.segments], offset) - 1
        try:
            for seg in self.segments[max(i, 0):]:
                if seg.next_offset <= offset:
                    continue
                budget = seg.read(offset, max_bytes, out, budget)
                if seg is not self.segments[-1]:
                    seg.release()
                if budget <= 0:
                    break
        except OSError as e:
            raise _storage_error(f"reading {self.dir}", e) from None
        return out

    # -- retention

    def enforce_retention(self, now: int | None = None) -> int:
        """Delete whole segments older than retention_ms or beyond retention_bytes; returns how many.

        A segment holding records the device has not accepted yet is never deleted:
        retention waits for the device rather than lose what it was promised.
        """
        deleted = 0
        cfg = self.config

        def deletable() -> bool:
            first = self.segments[0]
            return len(self.segments) > 1 and first.next_offset <= self._forwarded

        if cfg.retention_ms is not None:
            cutoff = (now_us() if now is None else now) - cfg.retention_ms * 1000
            active = self.segments[-1]
            # An expired active segment is rolled first so that it can go too.
            if active.size and active.max_timestamp < cutoff and all(s.max_timestamp < cutoff for s in self.segments):
                self._roll()
            while deletable() and self.segments[0].max_timestamp < cutoff:
                self.segments.pop(0).delete()
                deleted += 1
        if cfg.retention_bytes is not None:
            while deletable() and self.size_bytes > cfg.retention_bytes:
                self.segments.pop(0).delete()
                deleted += 1
        if deleted and cfg.fsync != "never":
            fsync_dir(self.dir)
        return deleted

    def close(self) -> None:
        try:
            self.sync()
        finally:
            for seg in self.segments:
                seg.close()


class Log:
    """Every topic under one data directory, plus the committed group offsets."""

    def __init__(self, data_dir: str | os.PathLike[str], config: LogConfig | None = None) -> None:
        self.config = config or LogConfig()
        self.root = Path(data_dir)
        self.topics_dir = self.root / "topics"
        self.topics_dir.mkdir(parents=True, exist_ok=True)
        self.id = store_id(self.root)
        self.partitions: dict[str, list[PartitionLog]] = {}
        for tdir in sorted(self.topics_dir.iterdir()):
            meta = tdir / "topic.json"
            if not meta.is_file():
                continue  # a CreateTopic that crashed before its metadata landed
            count = int(json.loads(meta.read_text())["partition_count"])
            self.partitions[tdir.name] = [PartitionLog(tdir / str(p), self.config) for p in range(count)]
        self.offsets: dict[tuple[str, str, int], int] = {}
        self._offsets_path = self.root / "offsets.log"
        self._load_offsets()
        self._offsets_fd = os.open(self._offsets_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._offsets_dirty = False

    # -- topics

    def create_topic(self, name: str, partition_count: int) -> None:
        if name in self.partitions:
            raise TopicExists(f"topic {name!r} already exists")
        if not 1 <= partition_count <= self.config.max_partitions:
            raise BadPartitionCount(f"partition count {partition_count} is outside 1..{self.config.max_partitions}")
        total = sum(map(len, self.partitions.values()))
        if total + partition_count > self.config.max_total_partitions:
            raise BadPartitionCount(f"{partition_count} more partitions would exceed the {self.config.max_total_partitions} "
                                    f"of all topics together ({total} exist; --max-total-partitions)")
        tdir = self.topics_dir / name
        try:
            tdir.mkdir(parents=True, exist_ok=True)
            parts = [PartitionLog(tdir / str(p), self.config) for p in range(partition_count)]
            tmp = tdir / "topic.json.tmp"
            tmp.write_text(json.dumps({"partition_count": partition_count}))
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, tdir / "topic.json")
            fsync_dir(tdir)
            fsync_dir(self.topics_dir)
        except OSError as e:
            raise _storage_error(f"creating topic {name!r}", e) from None
        self.partitions[name] = parts

    def topics(self) -> dict[str, int]:
        return {name: len(parts) for name, parts in sorted(self.partitions.items())}

    def partition(self, topic: str, partition: int) -> PartitionLog:
        parts = self.partitions.get(topic)
        if parts is None:
            raise TopicNotFound(f"topic {topic!r} not found")
        if not 0 <= partition < len(parts):
            raise PartitionNotFound(f"partition {partition} of topic {topic!r} not found (it has {len(parts)})")
        return parts[partition]

    def all_partitions(self) -> Iterator[tuple[str, int, PartitionLog]]:
        for name, parts in self.partitions.items():
            for p, plog in enumerate(parts):
                yield name, p, plog

    # -- committed offsets (durable, unlike the spec's in-memory commits)

    def _load_offsets(self) -> None:
        try:
            raw = self._offsets_path.read_bytes()
        except FileNotFoundError:
            return
        for line in raw.split(b"\n"):
            try:
                g, t, p, o = json.loads(line)
                self.offsets[(str(g), str(t), int(p))] = int(o)
            except (ValueError, TypeError):
                continue  # a torn last line
        # Compact: one line per key, replaced atomically.
        tmp = self._offsets_path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write("".join(json.dumps([g, t, p, o]) + "\n" for (g, t, p), o in self.offsets.items()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._offsets_path)
        fsync_dir(self.root)

    def commit(self, group: str, topic: str, partition: int, offset: int) -> None:
        self.partition(topic, partition)
        line = (json.dumps([group, topic, partition, offset]) + "\n").encode()
        try:
            write_all(self._offsets_fd, line)
            if self.config.fsync == "always":
                os.fsync(self._offsets_fd)
            else:
                self._offsets_dirty = True
        except OSError as e:
            raise _storage_error("writing offsets.log", e) from None
        self.offsets[(group, topic, partition)] = offset

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        return self.offsets.get((group, topic, partition))

    # -- maintenance

    def enforce_retention(self, now: int | None = None) -> int:
        return sum(plog.enforce_retention(now) for _, _, plog in self.all_partitions())

    def sync(self) -> None:
        for _, _, plog in self.all_partitions():
            plog.sync()
        if self._offsets_dirty:
            os.fsync(self._offsets_fd)
            self._offsets_dirty = False

    def close(self) -> None:
        for _, _, plog in self.all_partitions():
            plog.close()
        if self._offsets_dirty:
            os.fsync(self._offsets_fd)
        os.close(self._offsets_fd)
        self.partitions.clear()
