"""Which device each recent batch went to, so that a client's resend goes there too.

A Lumberjack or Log Courier client sends again, on a new connection, whatever was not
acknowledged when its connection died. When the bridge itself was killed, the first copy
of those events may already be journaled by the connection's home device. The resend is
a new connection, and a restarted bridge would home it afresh (`DeviceLink.affinity()`):
with several devices, on another device half the time. Two devices' copies are landed by
two importers, and neither can drop the other's copy by its `@metadata._id`.

So the bridge remembers, for every batch it sends, a fingerprint of the batch's first
event (the client's own key, or the payload's nonce) and the device it went to. A new
connection whose first batch starts with a remembered fingerprint is homed on that
device: both copies then meet in one importer, which keeps the first.

The memory is a ring of `slots` fixed-size records in a file (`--homes-file`), written
with `pwrite` before the batch is sent. A killed process's writes are in the page cache,
so the restarted bridge reads them back; a power loss may lose the last ones, which only
costs the homing (the rows are then doubled as before, never lost). Without a file the
ring lives in memory and serves resends to the running bridge.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import zlib

import orjson
from pathlib import Path

log = logging.getLogger("logjam-bridge")

# fingerprint, stamp (1, 2, ... in write order; 0 = empty), CRC32 of the device's endpoint
_SLOT = struct.Struct("<QQI4x")
DEFAULT_SLOTS = 65_536  # 1.5 MiB; a batch a slot, far more than a client has unacknowledged


def fingerprint(key: bytes) -> int:
    """A stable 64-bit fingerprint of a key (never 0, which marks an empty slot)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") or 1


def device_tag(endpoint: str) -> int:
    """How a device is named in the ring: stable across restarts and `--device` orders."""
    return zlib.crc32(endpoint.encode())


class BatchHomes:
    """fingerprint -> device tag for the newest `slots` batches, in a file when `path` is given."""

    def __init__(self, path: str | os.PathLike[str] | None = None, slots: int = DEFAULT_SLOTS) -> None:
        if slots < 1:
            raise ValueError("a homes ring needs at least one slot")
        self.slots = slots
        self._ring: list[tuple[int, int]] = [(0, 0)] * slots  # (fingerprint, stamp) of each slot
        self._where: dict[int, tuple[int, int]] = {}  # fingerprint -> (stamp, device tag)
        self._stamp = 0
        self._fd: int | None = None
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self._open(self.path)

    def _open(self, path: Path) -> None:
        size = self.slots * _SLOT.size
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        data = os.pread(self._fd, size + 1, 0)
        if len(data) != size:
            # New, or written with another number of slots: start empty rather than misread it.
            os.ftruncate(self._fd, 0)
            os.ftruncate(self._fd, size)
            return
        records = sorted((stamp, fp, tag, i) for i, (fp, stamp, tag) in enumerate(_SLOT.iter_unpack(data)) if stamp)
        for stamp, fp, tag, i in records:
            self._ring[i] = (fp, stamp)
            self._where[fp] = (stamp, tag)
        if records:
            self._stamp = records[-1][0]
        log.info("homes %s: %d recent batches remembered", path, len(records))

    def remember(self, key: bytes, tag: int) -> None:
        """The batch starting with `key` goes to the device `tag`; written before it is sent."""
        fp = fingerprint(key)
        self._stamp += 1
        stamp = self._stamp
        i = stamp % self.slots
        old_fp, old_stamp = self._ring[i]
        if old_stamp and self._where.get(old_fp, (0, 0))[0] == old_stamp:
            del self._where[old_fp]
        self._ring[i] = (fp, stamp)
        self._where[fp] = (stamp, tag)
        if self._fd is not None:
            try:
                os.pwrite(self._fd, _SLOT.pack(fp, stamp, tag), i * _SLOT.size)
            except OSError as e:  # a full disk costs the homing only, never the batch
                log.warning("homes %s: %s; resends after a restart may reach another device", self.path, e)

    def home_of(self, key: bytes) -> int | None:
        """The device tag the batch starting with `key` went to, if it is remembered."""
        found = self._where.get(fingerprint(key))
        return None if found is None else found[1]

    def __len__(self) -> int:
        return len(self._where)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def client_key(doc: bytes | memoryview) -> bytes | None:
    """The client's own `@metadata._id` of a JSON event (Beats' fingerprint processor), if it set one.

    Only such a key is the same on a resend: what the bridge keys itself is new each time.
    Events without `"_id"` anywhere are not parsed."""
    if isinstance(doc, memoryview):
        doc = doc.tobytes()  # `in` on a view looks for one byte, not a substring
    if b'"_id"' not in doc:
        return None
    try:
        event = orjson.loads(doc)
    except orjson.JSONDecodeError:
        return None
    meta = event.get("@metadata") if isinstance(event, dict) else None
    key = meta.get("_id") if isinstance(meta, dict) else None
    return key.encode() if isinstance(key, str) and key else None
