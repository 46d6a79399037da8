"""The device journal: every accepted message, with its sequence number, on disk.

The device appends each committed batch here after numbering it and before
publishing it or answering 202, so everything a client saw accepted can be replayed.

Layout: `<dir>/<first seq, 20 digits>.journal` segment files of runtime/seglog.py's
segmented-log engine (which owns the files, rolling, CRC frames, torn-tail recovery,
fsync policy and retention). Each frame is one whole batch, one `write()`:

    u32 body length | u32 crc32(body) | u64 first seq | u32 count | body
    body = count x (u16 app-env len | u16 topic len | u32 body len | app-env | topic | body | meta[24])

Sequence numbers are consecutive across the journal (heartbeats are journaled too),
so a batch header locates any sequence number. A crash can leave a torn last batch;
opening the journal truncates it (its messages were never published nor acknowledged,
because both happen after the append). Sequence numbers continue from the last whole
batch. A bad batch before the last segment is `JournalCorrupt`.

Identity: `<dir>/journal-id` holds 16 random hex digits, made (and fsynced) when the
journal is first opened and never changed for that directory. Sequence numbers are
only meaningful together with it: a wiped or replaced directory starts again at 1
under a new id, so a reader's checkpoint for the old id cannot swallow the new numbers.

Fsync policies (runtime/config.py's words): `always` (fsync every append: survives power
loss), `interval` (fsync at most every N ms: a power loss may lose the last N ms),
`never` (leave it to the page cache: survives a process kill, not a power loss).
Retention deletes whole segments, oldest first, by total size and by age (the time of
a segment's last write); the active segment is never deleted.

A write that fails (a full disk: ENOSPC, a file-size limit: EFBIG, an I/O error) raises
`JournalWriteError` after cutting the segment back to its last whole batch, so no torn
bytes stay behind and the same batch can be appended again later.
"""

from __future__ import annotations

import logging
import re
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from runtime.durable import replace_file
from runtime.seglog import Framing, SegmentedLog
from logjam.errors import CorruptStore
from logjam.meta import META_SIZE

log = logging.getLogger("logjam-device")

# The batch frame: length, crc32 of the body, first seq, count.
FRAMING = Framing(">IIQI", length=0, crc=1, span=lambda f: (f[2], f[2] + f[3]))
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


@dataclass(frozen=True, slots=True)
class Gone:
    """The requested sequence numbers were deleted by retention; the journal starts at `first_seq`."""

    first_seq: int


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
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.journal_id = self._load_id()
        self._log = SegmentedLog(
            self.dir, FRAMING, suffix=SUFFIX, start=1, segment_bytes=segment_bytes, index_every=INDEX_EVERY,
            fsync=fsync, fsync_interval_s=fsync_interval_ms / 1000, retention_bytes=retention_bytes,
            retention_age=retention_s, corrupt=JournalCorrupt, what="journal", frame="batch", logger=log,
        )

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
        # Whatever the policy: the id must outlive every batch written under it.
        replace_file(path, f"{journal_id}\n", fsync="always")
        return journal_id

    # -- state ----------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """The highest journaled sequence number (0 for an empty journal)."""
        return self._log.next - 1

    @property
    def first_seq(self) -> int:
        return self._log.first

    @property
    def size(self) -> int:
        return self._log.size

    @property
    def segment_count(self) -> int:
        return len(self._log.segments)

    @property
    def fsyncs(self) -> int:
        return self._log.fsyncs

    @property
    def bytes_written(self) -> int:
        return self._log.bytes_written

    @property
    def segments_deleted(self) -> int:
        return self._log.segments_deleted

    @property
    def retention_s(self) -> float | None:
        return self._log.retention_age

    @retention_s.setter
    def retention_s(self, value: float | None) -> None:
        self._log.retention_age = value

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
        if first_seq != self._log.next:
            raise ValueError(f"journal expects seq {self._log.next}, got {first_seq}")
        try:
            # One writev per batch (no joined copy of a large payload); the engine cuts a failed one off.
            self._log.append([(first_seq, first_seq + count, FRAMING.encode(payload, first_seq, count), payload)])
        except OSError as e:
            # Nothing of this batch was published or acknowledged, and the file ends with a whole
            # batch again (or is cut before the next append): the caller can append it later.
            raise self._write_error(e) from e

    def _write_error(self, e: OSError) -> JournalWriteError:
        return JournalWriteError(e.errno or 0, e.strerror or str(e), str(self._log.active.path))

    def sync(self) -> None:
        self._log.sync()

    def tick(self) -> bool:
        """Called periodically by the device: retention, and interval fsyncs.

        Returns whether an interval fsync was due; a failed fsync raises JournalWriteError.
        """
        self.enforce_retention()
        try:
            return self._log.tick()
        except OSError as e:
            raise self._write_error(e) from e

    def enforce_retention(self, now: float | None = None) -> int:
        """Delete old segments by size and age; returns how many were deleted."""
        return self._log.enforce_retention(now)

    def close(self) -> None:
        try:
            self._log.close()
        except OSError as e:
            log.error("journal: fsync at close failed: %s (%s)", e, self._log.active.path)

    # -- reading (safe from another thread) -------------------------------------------

    def read(self, from_seq: int, max_count: int = 1000, max_bytes: int = 4 * 1024 * 1024) -> list[tuple[bytes, bytes, bytes, bytes]] | Gone:
        """Messages from `from_seq` on, in order: at most `max_count`, stopping after `max_bytes`.

        Returns Gone when `from_seq` was deleted by retention, [] past the end.
        """
        found = self._log.find(from_seq)
        if found is None:
            return Gone(self._log.first)
        seg, pos, end = found
        if from_seq >= seg.next:
            return []
        out: list[tuple[bytes, bytes, bytes, bytes]] = []
        used = 0
        for (_, _, batch_first, count), view, _, pos in self._log.read(seg, pos, end, private=True):
            if batch_first + count - 1 < from_seq:
                continue
            payload = bytes(view)
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
            if len(out) >= max_count or used >= max_bytes:
                return out
        if pos < end and from_seq < seg.next:
            if not seg.path.exists():  # retention deleted it since `find`
                return Gone(self._log.first)
            raise JournalCorrupt(f"{seg.path}: bad batch after byte {pos}")
        return out
