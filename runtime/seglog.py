"""The one segmented-log engine under every durable log: the device journal, the segment store, the RustLog log.

What a log on disk needs, written once:

- `Framing`: CRC frames, declared rather than coded. A frame is a fixed header (a
  `struct` format) holding a CRC-32 and, for frames with a payload, its length, then the
  payload. The CRC covers the payload alone, or every byte of the frame but its own.
  `encode` makes a header, `frames` reads valid frames up to the first torn or corrupt one.
- `AppendFile`: one append-only file: whole writes at its valid length (a short write is
  continued, a failed one cut back so no torn bytes stay behind), fsync tracking, and a
  descriptor opened on use so that thousands of idle files hold none.
- `SegmentedLog`: a directory of `<first position, 20 digits><suffix>` segment files of
  frames with consecutive positions: recovery at open (the last segment is cut at its
  first torn or corrupt frame; earlier ones are verified or trusted), rolling at
  `segment_bytes`, all-or-nothing appends (a failed write or fsync leaves the log as it
  was, segments it rolled included), the fsync policy, a sparse index (in memory, and in
  a `<base><index suffix>` file where the log keeps one) and retention by size and age.

Each log keeps its own record format on top: what a frame's payload holds, what its
position counts (a journal's sequence numbers, a partition's offsets) and what its time
is (the wall clock of the write, or the records' own timestamps).

The fsync policies are runtime/config.py's: `always` fsyncs before an append returns,
`interval` at most every `fsync_interval_s` (from appends and `tick`, or from the
owner's own `sync` calls), `never` leaves it to the page cache. Rolling fsyncs the
finished segment and the directory, unless `never`.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import struct
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from runtime.config import FSYNC_POLICIES
from runtime.durable import fsync_dir, write_all

log = logging.getLogger(__name__)

# A header and its payload as a list of buffers; above this many, one joined write (writev's IOV_MAX is 1024).
_MAX_PARTS = 64
INDEX_ENTRY = struct.Struct(">II")  # position - base, byte offset: the on-disk sparse index


class Framing:
    """How one CRC frame sits on disk.

    `fmt` is the header's struct format; `crc` and `length` are the indexes of its CRC and
    payload-length fields (`length=None`: fixed-size frames without payload). The length
    field must be the first field other than the CRC. `covers_header`: the CRC covers every
    header byte but its own plus the payload (the CRC field then comes first or last);
    otherwise the payload alone. `span(fields)` gives a frame's (first position, next
    position), which must continue from the frame before.
    """

    def __init__(self, fmt: str, *, crc: int, span: Callable[[tuple], tuple[int, int]],
                 length: int | None = None, covers_header: bool = False) -> None:
        self.header = struct.Struct(fmt)
        self.size = self.header.size
        self.crc = crc
        self.length = length
        self.span = span
        self.covers_header = covers_header
        codes = re.findall(r"\d*[a-zA-Z?]", fmt.lstrip("<>!=@"))
        if length is not None and length != (1 if crc == 0 else 0):
            raise ValueError("the length field must be the first field other than the CRC")
        if covers_header and crc not in (0, len(codes) - 1):
            raise ValueError("a CRC over the header must be its first or last field")
        prefix = fmt[0] if fmt[0] in "<>!=@" else ""
        self._crc_at = struct.calcsize(prefix + "".join(codes[:crc]))
        self._crc_end = self._crc_at + 4
        self._rest = struct.Struct(prefix + "".join(c for i, c in enumerate(codes) if i != crc))
        self._crc_first = crc == 0
        self._crc_field = struct.Struct(prefix + "I")

    def encode(self, payload: Any, *fields: Any) -> bytes:
        """The header of a frame: `fields` are every field but the CRC and the length, in order."""
        crc32 = zlib.crc32
        values = [len(payload), *fields] if self.length is not None else list(fields)
        if not self.covers_header:
            values.insert(self.crc, crc32(payload))
            return self.header.pack(*values)
        rest = self._rest.pack(*values)
        crc = self._crc_field.pack(crc32(payload, crc32(rest)))
        return crc + rest if self._crc_first else rest + crc

    def frames(self, read: Callable[[int, int], bytes], pos: int, end: int,
               chunk: int = 1 << 20) -> Iterator[tuple[tuple, memoryview, int, int]]:
        """(fields, payload, frame start, frame end) of the valid frames in [pos, end), up to the first bad one.

        `read(n, offset)` reads the file (os.pread). Continuity of positions is the caller's.
        """
        size, unpack, length, crc_at, crc_end, crc, covers = (
            self.size, self.header.unpack_from, self.length, self._crc_at, self._crc_end, self.crc, self.covers_header)
        crc32 = zlib.crc32
        buf = b""
        base = pos  # file offset of buf[0]
        while pos + size <= end:
            i = pos - base
            if i + size > len(buf):
                buf = buf[i:] + read(min(max(chunk, size), end - pos - (len(buf) - i)), base + len(buf))
                base, i = pos, 0
                if len(buf) < size:
                    return
            fields = unpack(buf, i)
            n = fields[length] if length is not None else 0
            stop = i + size + n
            if pos + size + n > end:
                return
            if stop > len(buf):
                buf = buf[i:] + read(stop - len(buf), base + len(buf))
                base, i, stop = pos, 0, size + n
                if stop > len(buf):
                    return
            view = memoryview(buf)
            if covers:
                ok = crc32(view[i + crc_end : stop], crc32(view[i : i + crc_at])) == fields[crc]
            else:
                ok = crc32(view[i + size : stop]) == fields[crc]
            if not ok:
                return
            yield fields, view[i + size : stop], pos, pos + size + n
            pos += size + n


def walk(framing: Framing, read: Callable[[int, int], bytes], position: int, pos: int,
         end: int) -> Iterator[tuple[tuple, int, int, int, int]]:
    """(fields, first position, next position, frame start, frame end) of a segment's frames from
    byte `pos` (holding `position`) to `end`, up to the first torn or corrupt frame or the first
    whose positions do not continue: the frames recovery keeps."""
    span = framing.span
    for fields, _, start, stop in framing.frames(read, pos, end):
        first, following = span(fields)
        if first != position or following < first:
            return
        yield fields, first, following, start, stop
        position = following


class AppendFile:
    """One append-only file: `size` is its valid length; writes go there, whole or not at all."""

    def __init__(self, path: Path, size: int | None = None) -> None:
        self.path = path
        self._fd: int | None = None
        if size is None:
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                size = 0
                self.fd  # create it
        self.size = size
        self.unsynced = False
        self._torn = False  # a failed write left bytes past `size` that could not be cut off yet

    @property
    def fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    def append(self, parts: Sequence[Any]) -> int:
        """Write `parts` at the end; on an OSError nothing of them stays (cut back) and it is raised."""
        if self._torn:
            self._cut()
        try:
            n = write_all(self.fd, parts, self.size)
        except OSError:
            self.rewind(self.size)
            raise
        self.size += n
        self.unsynced = True
        return n

    def rewind(self, size: int) -> None:
        """Forget everything past `size`: cut it now, or before the next append if that fails."""
        self.size = size
        self._torn = True
        try:
            self._cut()
        except OSError:
            pass

    def _cut(self) -> None:
        if os.fstat(self.fd).st_size != self.size:
            os.ftruncate(self.fd, self.size)
        self._torn = False

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        self.size = size

    def read(self, n: int, offset: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def sync(self) -> bool:
        """fsync what was written since the last one; whether there was anything."""
        if not self.unsynced:
            return False
        # Cleared first: an append from another thread while this fsync runs sets it again.
        self.unsynced = False
        try:
            os.fsync(self.fd)
        except OSError:
            self.unsynced = True
            raise
        return True

    def release(self) -> None:
        """Close the descriptor; the next use opens it again."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def delete(self) -> None:
        self.release()
        self.path.unlink(missing_ok=True)


class LogSegment(AppendFile):
    """One segment file of a SegmentedLog: positions [base, next)."""

    def __init__(self, path: Path, base: int, index_path: Path | None) -> None:
        super().__init__(path)
        self.base = base
        self.next = base
        self.time = 0.0  # the log's clock: newest write or record; retention compares it
        self.index: list[tuple[int, int]] = []  # (first position of a frame, its byte offset), ascending
        self.index_file = AppendFile(index_path) if index_path is not None else None
        self._indexed_at = -1  # byte offset of the newest indexed frame

    def offset_of(self, position: int) -> int:
        """Byte offset of the newest indexed frame at or before `position` (0 when none): where a read scans from."""
        j = bisect.bisect_right(self.index, (position, 1 << 62)) - 1
        return self.index[j][1] if j >= 0 else 0

    def sync(self) -> bool:
        synced = super().sync()
        if self.index_file is not None:
            self.index_file.sync()
        return synced

    def release(self) -> None:
        super().release()
        if self.index_file is not None:
            self.index_file.release()

    def delete(self) -> None:
        super().delete()
        if self.index_file is not None:
            self.index_file.delete()


class SegmentedLog:
    """A directory of segments holding frames with consecutive positions; see the module docstring."""

    def __init__(self, directory: str | os.PathLike[str], framing: Framing, *, suffix: str, start: int = 0,
                 segment_bytes: int, index_every: int, fsync: str = "never", fsync_interval_s: float | None = None,
                 index_suffix: str | None = None, verify_sealed: bool = True, release_idle: bool = False,
                 retention_bytes: int | None = None, retention_age: float | None = None,
                 clock: Callable[[], float] = time.time, time_of: Callable[[tuple], float] | None = None,
                 corrupt: Callable[[str], Exception] = ValueError, what: str = "log", frame: str = "frame",
                 logger: logging.Logger = log) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
        self.dir = Path(directory)
        self.framing = framing
        self.suffix = suffix
        self.segment_bytes = segment_bytes
        self.index_every = index_every
        self.fsync = fsync
        self.fsync_interval_s = fsync_interval_s
        self.index_suffix = index_suffix
        self.release_idle = release_idle
        self.retention_bytes = retention_bytes
        self.retention_age = retention_age
        self.clock = clock
        self.time_of = time_of
        self._corrupt = corrupt
        self._what, self._frame, self._log = what, frame, logger
        self._name = re.compile(r"(\d{20})" + re.escape(suffix) + r"\Z")
        # Guards the segment list and each segment's size, next and index for readers in other threads.
        self.lock = threading.Lock()
        self.segments: list[LogSegment] = []
        self.fsyncs = 0
        self.bytes_written = 0
        self.segments_deleted = 0
        self._last_sync = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._recover(verify_sealed, start)

    # -- opening and recovery ---------------------------------------------------------

    def _segment(self, base: int) -> LogSegment:
        index = self.dir / f"{base:020d}{self.index_suffix}" if self.index_suffix else None
        seg = LogSegment(self.dir / f"{base:020d}{self.suffix}", base, index)
        if self.time_of is None:
            seg.time = self.clock()  # a new segment's age starts now; recovery reads the file's
        return seg

    def _recover(self, verify_sealed: bool, start: int) -> None:
        bases = sorted(int(m.group(1)) for p in self.dir.iterdir() if (m := self._name.match(p.name)))
        for i, base in enumerate(bases):
            seg = self._segment(base)
            last = i == len(bases) - 1
            if self.time_of is None:
                seg.time = os.stat(seg.path).st_mtime
            if last or verify_sealed:
                valid = self._scan(seg, base, 0, rebuild=True)
            else:
                self._load_index(seg)
                valid = self._scan(seg, *(seg.index[-1] if seg.index else (base, 0)))
                seg.next = bases[i + 1]
            if valid < seg.size:
                if not last and verify_sealed:
                    raise self._corrupt(f"{seg.path}: bad {self._frame} at byte {valid} of {seg.size}, before the last segment")
                # A torn tail: its write was never acknowledged.
                self._log.warning("%s: truncating %d bytes of a torn last %s at byte %d of %s",
                                  self._what, seg.size - valid, self._frame, valid, seg.path)
                seg.truncate(valid)
            if self.release_idle or not last:
                seg.release()
            self.segments.append(seg)
        if not self.segments:
            self.segments.append(self._segment(start))
            if self.release_idle:
                self.segments[-1].release()
            if self.fsync != "never":
                fsync_dir(self.dir)

    def _load_index(self, seg: LogSegment) -> None:
        raw = seg.index_file.read(seg.index_file.size, 0) if seg.index_file is not None else b""
        for rel, pos in INDEX_ENTRY.iter_unpack(raw[: len(raw) - len(raw) % INDEX_ENTRY.size]):
            # Entries past the file or out of order come from a torn write; stop there.
            if pos <= seg._indexed_at or pos >= seg.size:
                break
            seg.index.append((seg.base + rel, pos))
            seg._indexed_at = pos

    def _scan(self, seg: LogSegment, position: int, pos: int = 0, rebuild: bool = False) -> int:
        """Walk the valid frames from byte `pos` (holding `position`); sets `next`; returns the valid end."""
        if rebuild:
            seg.index.clear()
            seg._indexed_at = -1
            if seg.index_file is not None:
                seg.index_file.truncate(0)
        time_of = self.time_of
        end = pos
        for fields, first, following, start, stop in walk(self.framing, seg.read, position, pos, seg.size):
            if rebuild:
                self._index(seg, first, start)
            if time_of is not None:
                seg.time = max(seg.time, time_of(fields))
            position, end = following, stop
        seg.next = position
        return end

    # -- positions ----------------------------------------------------------------------

    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def first(self) -> int:
        """The oldest position held."""
        return self.segments[0].base

    @property
    def next(self) -> int:
        """The position the next frame must start at."""
        return self.segments[-1].next

    @property
    def size(self) -> int:
        return sum(s.size for s in list(self.segments))

    def find(self, position: int) -> tuple[LogSegment, int, int] | None:
        """(segment, byte offset to scan from, valid end) for a read at `position`; None before `first`.

        Safe from another thread: taken under the lock, so the answer is a consistent snapshot.
        """
        with self.lock:
            segments = self.segments
            if position < segments[0].base:
                return None
            i = bisect.bisect_right([s.base for s in segments], position) - 1
            seg = segments[i]
            return seg, seg.offset_of(position), seg.size

    def read(self, seg: LogSegment, pos: int, end: int, *, chunk: int = 1 << 20,
             private: bool = False) -> Iterator[tuple[tuple, memoryview, int, int]]:
        """The frames of `seg` from byte `pos` to `end`; `private` reads through a descriptor of its own
        (for a reader in another thread, whose segment the writer may close or delete meanwhile)."""
        if not private:
            yield from self.framing.frames(seg.read, pos, end, chunk)
            return
        try:
            fd = os.open(seg.path, os.O_RDONLY)
        except FileNotFoundError:
            return  # deleted by retention since `find`
        try:
            yield from self.framing.frames(lambda n, offset: os.pread(fd, n, offset), pos, end, chunk)
        finally:
            os.close(fd)

    # -- appending ----------------------------------------------------------------------

    def append(self, frames: Sequence[tuple[int, int, bytes, Any]], *, sync: bool = True,
               when: float | None = None) -> None:
        """Append (first position, next position, header, payload) frames, all or nothing.

        Frames go to the active segment, rolling to a new one before a frame that would
        take a non-empty segment past `segment_bytes`. An OSError (a full disk, a failed
        fsync) leaves the log as it was and is raised. `sync=False` leaves an `always`
        fsync to the caller, who calls `sync()` before acknowledging. `when` is the frames'
        time (default: the clock).
        """
        if not frames:
            return
        if frames[0][0] != self.next:
            raise ValueError(f"log expects position {self.next}, got {frames[0][0]}")
        when = self.clock() if when is None else when
        count, seg = len(self.segments), self.segments[-1]
        undo = (seg.size, seg.next, seg.time, len(seg.index), seg._indexed_at,
                seg.index_file.size if seg.index_file is not None else 0)
        written = 0
        try:
            parts: list[Any] = []
            offset = seg.size
            for first, following, header, payload in frames:
                n = len(header) + len(payload)
                if offset > 0 and offset + n > self.segment_bytes:
                    written += self._write(seg, parts, offset, first, when)
                    parts = []
                    self.roll()
                    seg, offset = self.segments[-1], 0
                self._index(seg, first, offset)
                parts.append(header)
                parts.append(payload)
                offset += n
            written += self._write(seg, parts, offset, following, when)
            if self.fsync == "always" and sync or self.fsync == "interval" and self._interval_due():
                self.sync()
        except OSError:
            self._undo(count, undo)
            raise
        self.bytes_written += written

    def _write(self, seg: LogSegment, parts: list[Any], end: int, following: int, when: float) -> int:
        if not parts:
            return 0
        n = seg.append([b"".join(parts)] if len(parts) > _MAX_PARTS else parts)
        # Readers look only up to `size`, which moves after the write.
        with self.lock:
            seg.size = end
            seg.next = following
            seg.time = max(seg.time, when) if self.time_of is not None else when
        return n

    def _index(self, seg: LogSegment, first: int, offset: int) -> None:
        if seg.index and offset - seg._indexed_at < self.index_every:
            return
        with self.lock:
            seg.index.append((first, offset))
        seg._indexed_at = offset
        if seg.index_file is not None:
            seg.index_file.append([INDEX_ENTRY.pack(first - seg.base, offset)])

    def _undo(self, count: int, state: tuple[int, int, float, int, int, int]) -> None:
        """Back to `count` segments, the last one as `state` says (after a failed append)."""
        with self.lock:
            rolled = self.segments[count:]
            del self.segments[count:]
            seg = self.segments[-1]
            size, seg.next, seg.time, n_index, seg._indexed_at, index_size = state
            del seg.index[n_index:]
        for extra in rolled:
            extra.delete()
        seg.rewind(size)
        if seg.index_file is not None:
            seg.index_file.rewind(index_size)

    def roll(self) -> None:
        """Seal the active segment (fsynced unless `never`) and start the next one at `next`."""
        old = self.segments[-1]
        seg = self._segment(old.next)  # the new file first: if it cannot be made, the old one stays active
        with self.lock:
            self.segments.append(seg)
        try:
            if self.fsync != "never":
                old.sync()
        finally:
            old.release()
        if self.fsync != "never":
            fsync_dir(self.dir)

    # -- fsync ----------------------------------------------------------------------------

    def _interval_due(self) -> bool:
        return self.fsync_interval_s is not None and time.monotonic() - self._last_sync >= self.fsync_interval_s

    def sync(self) -> None:
        """fsync the active segment if anything is unsynced; an OSError is the caller's."""
        self._last_sync = time.monotonic()
        if self.segments[-1].sync():
            self.fsyncs += 1

    def tick(self) -> bool:
        """The interval policy's timer: fsync if due. Whether it was due."""
        if self.fsync == "interval" and self._interval_due():
            self.sync()
            return True
        return False

    # -- retention ------------------------------------------------------------------------

    def enforce_retention(self, now: float | None = None,
                          deletable: Callable[[LogSegment], bool] = lambda seg: True) -> int:
        """Delete the oldest segments beyond `retention_bytes` or older than `retention_age`; never
        the active one, nor one `deletable` refuses. Returns how many were deleted."""
        now = self.clock() if now is None else now
        deleted = 0
        while len(self.segments) > 1:
            oldest = self.segments[0]
            too_big = self.retention_bytes is not None and self.size > self.retention_bytes
            too_old = self.retention_age is not None and now - oldest.time > self.retention_age
            if not (too_big or too_old) or not deletable(oldest):
                break
            with self.lock:
                self.segments.pop(0)
            oldest.delete()
            deleted += 1
        if deleted:
            self.segments_deleted += deleted
            if self.fsync != "never":
                fsync_dir(self.dir)
        return deleted

    def close(self) -> None:
        """fsync the active segment (unless `never`) and close every descriptor."""
        try:
            if self.fsync != "never":
                self.sync()
        finally:
            for seg in self.segments:
                seg.release()
