"""The RustLog bridge's durable partitioned log: topics, segment files, offsets, retention.

Layout under the data directory::

    topics/<topic>/topic.json                  {"partition_count": N}
    topics/<topic>/<partition>/<base>.log      segment: records with consecutive offsets
    topics/<topic>/<partition>/<base>.index    sparse index: (relative offset u32, position u32)
    topics/<topic>/<partition>/forwarded       how far the device has accepted this partition
    offsets.log                                committed group offsets, one JSON line each

One segment file, its record format and its recovery are in log_segment.py; this module
holds the partitions (a list of segments, the last one active), the topics and the
committed group offsets.

No sockets here, and no asyncio: the bridge calls these methods from its event loop.
"""

from __future__ import annotations

import bisect
import json
import os
from pathlib import Path
from typing import Iterator, Sequence

from bridges.host.files import store_id
from runtime.durable import fsync_dir, replace_file
from runtime.seglog import AppendFile, SegmentedLog

from bridges.rustlog.log_segment import (  # noqa: F401 (re-exported: the log's one vocabulary)
    _WATERMARK_CHECK, FRAMING, HEADER, HEADER_SIZE, INDEX_ENTRY, WATERMARK, LogConfig, LogError, StorageError,
    StoredRecord, _storage_error, now_us,
)


class TopicNotFound(LogError):
    pass


class PartitionNotFound(LogError):
    pass


class TopicExists(LogError):
    pass


class BadPartitionCount(LogError):
    pass


class PartitionLog:
    """One topic-partition: the engine's segmented log of records, and how far the device has it."""

    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.dir = directory
        self.config = config
        # Segments are opened on use and released when sealed or idle, so that a
        # thousand-partition topic does not hold thousands of files open.
        self._log = SegmentedLog(
            directory, FRAMING, suffix=".log", index_suffix=".index", start=0, segment_bytes=config.segment_bytes,
            index_every=config.index_interval_bytes, fsync=config.fsync, verify_sealed=False, release_idle=True,
            retention_bytes=config.retention_bytes,
            retention_age=config.retention_ms * 1000 if config.retention_ms is not None else None,
            clock=now_us, time_of=lambda fields: fields[3], what=f"rustlog {directory}", frame="record",
        )
        self._wm_path = directory / "forwarded"
        self._forwarded = self._read_watermark()

    # -- positions

    @property
    def high_watermark(self) -> int:
        return self._log.next

    @property
    def log_start_offset(self) -> int:
        return self._log.first

    @property
    def segment_count(self) -> int:
        return len(self._log.segments)

    # -- the forwarded watermark (see docs/protocols/rustlog.md, "Crash between the log and the device")

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
        encode = FRAMING.encode
        frames = [(base + i, base + i + 1, encode(payload, base + i, ts), payload) for i, payload in enumerate(records)]
        try:
            self._log.append(frames, sync=sync, when=ts)
        except OSError as e:
            raise _storage_error(f"appending in {self.dir}", e) from None
        return base

    def sync(self) -> None:
        try:
            self._log.sync()
        except OSError as e:
            raise _storage_error(f"fsync in {self.dir}", e) from None

    def read(self, offset: int, max_bytes: int) -> list[StoredRecord]:
        """Records from `offset` (must be within [log_start, high_watermark]); at least one if any."""
        out: list[StoredRecord] = []
        budget = max(max_bytes, 1)
        segments = self._log.segments
        i = bisect.bisect_right([s.base for s in segments], offset) - 1
        # Read about what the answer needs plus the distance from the index entry, in one go.
        chunk = min(max(budget + self.config.index_interval_bytes + HEADER_SIZE, 1 << 16), 8 << 20)
        try:
            for seg in segments[max(i, 0):]:
                if seg.next <= offset:
                    continue
                for (_, _, rec_offset, ts), payload, _, _ in self._log.read(seg, seg.offset_of(offset), seg.size, chunk=chunk):
                    if rec_offset >= seg.next:
                        break
                    if rec_offset < offset:
                        continue
                    size = HEADER_SIZE + len(payload)
                    if out and size > budget:
                        budget = 0
                        break
                    out.append(StoredRecord(rec_offset, ts, bytes(payload)))
                    budget -= size
                    if budget <= 0:
                        break
                if seg is not segments[-1]:
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
        now = now_us() if now is None else now
        if self.config.retention_ms is not None:
            cutoff = now - self.config.retention_ms * 1000
            active = self._log.active
            # An expired active segment is rolled first so that it can go too.
            if active.size and all(s.time < cutoff for s in self._log.segments):
                self._log.roll()
        return self._log.enforce_retention(now, lambda seg: seg.next <= self._forwarded)

    def close(self) -> None:
        try:
            self.sync()
        finally:
            self._log.close()


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
        self._offsets = AppendFile(self._offsets_path)

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
            replace_file(tdir / "topic.json", json.dumps({"partition_count": partition_count}))
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
        replace_file(self._offsets_path, "".join(json.dumps([g, t, p, o]) + "\n" for (g, t, p), o in self.offsets.items()))

    def commit(self, group: str, topic: str, partition: int, offset: int) -> None:
        self.partition(topic, partition)
        line = (json.dumps([group, topic, partition, offset]) + "\n").encode()
        try:
            self._offsets.append([line])
            if self.config.fsync == "always":
                self._offsets.sync()
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
        self._offsets.sync()

    def close(self) -> None:
        for _, _, plog in self.all_partitions():
            plog.close()
        try:
            self._offsets.sync()
        finally:
            self._offsets.release()
        self.partitions.clear()
