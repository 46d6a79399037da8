"""Byte-level rules the device applies to every message, kept free of I/O.

The hot loop must not decode a `Meta` per message, so the checks here work on raw
frame bytes: a valid meta is recognised by its length and its first four bytes
(tag, compression, version), and renumbering rewrites only the device, created_ms
and sequence fields. The rules themselves come from `logjam.meta` and
`logjam.validation`; this module only precomputes them into lookups.
"""

from __future__ import annotations

import struct

from logjam.meta import (META_CREATED, META_HEAD, META_RENUMBER, META_SIZE, META_STRUCT, META_TAG,
                         META_TAG_SWAPPED, META_VERSION, Compression)
from logjam.validation import is_valid_app_env

# Every acceptable first four bytes of a meta frame, mapped to what we publish: the
# byte-swapped tag is accepted (the reference device does) but normalised on output.
def _head(tag: int, compression: int) -> bytes:
    """The first four bytes of a meta frame, from the one layout in logjam.meta."""
    return META_STRUCT.pack(tag, compression, META_VERSION, 0, 0, 0)[META_HEAD]


HEADS: dict[bytes, bytes] = {
    _head(tag, comp): _head(META_TAG, comp) for tag in (META_TAG, META_TAG_SWAPPED) for comp in Compression
}
HEAD_FOR: dict[int, bytes] = {c: _head(META_TAG, c) for c in Compression}

# A meta for clients that sent none (3-frame PULL messages) and for the device's own
# heartbeats: created_ms 0 makes `stamp` fill in the current time.
FRESH_META = HEAD_FOR[Compression.NONE] + bytes(META_SIZE - META_HEAD.stop)
ZERO_MS = bytes(8)

# (normalised head, device, created_ms, seq) -> the published meta, in one call (logjam.meta's layout).
pack_meta = META_RENUMBER.pack
_U32 = struct.Struct(">I")

REASONS = ("frame_count", "broken_meta", "bad_app_env", "bad_topic")
INVALID_LABEL = "<invalid>"
OTHER_LABEL = "<other>"


def meta_ok(meta: bytes) -> bool:
    """The checks the reference device makes: length 24, known tag, version 1, known compression."""
    return len(meta) == META_SIZE and meta[META_HEAD] in HEADS


def device_bytes(device_id: int) -> bytes:
    if not 0 <= device_id < 2**32:
        raise ValueError(f"device id must fit in 32 bits, got {device_id}")
    return _U32.pack(device_id)


def stamp(meta: bytes, device: bytes, seq: int, now: bytes) -> bytes:
    """The published meta: our device number and sequence, the client's created_ms unless it is 0.

    `meta` must have passed `meta_ok`. (`TupleBatch.number` inlines this for speed,
    and the native engine does the same in C.)
    """
    created = meta[META_CREATED]
    return pack_meta(HEADS[meta[META_HEAD]], device, now if created == ZERO_MS else created, seq)


def with_compression(meta: bytes, method: int) -> bytes:
    """`meta` with its compression byte replaced (used by --compress)."""
    return HEAD_FOR[method] + meta[META_HEAD.stop:]


def label(name: bytes) -> str:
    """A metrics label for a stream name: the name if it is valid, otherwise one shared label."""
    if is_valid_app_env(name):
        return name.decode("ascii", "replace")
    return INVALID_LABEL
