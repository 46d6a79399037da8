"""The 24-byte Logjam meta frame: tag, compression, version, device, created_ms, sequence.

All fields are big-endian. The reference C device also accepts the byte-swapped tag
0xBDCA (written by clients that forgot htons), so we do too; every other field is
still read big-endian.
"""

from __future__ import annotations

import enum
import struct
import time
from dataclasses import dataclass

# The frame's constants live in logjam/constants.py, shared with the C modules; imported from here too.
from logjam.constants import META_SIZE, META_TAG, META_TAG_SWAPPED, META_VERSION  # noqa: F401
from logjam.errors import MetaError

SEQ_MAX = 2**64 - 1

# The one layout: tag, compression, version, device, created_ms, seq.
_FIELDS = (("tag", "H"), ("compression", "B"), ("version", "B"), ("device", "I"), ("created_ms", "Q"), ("seq", "Q"))
META_STRUCT = struct.Struct(">" + "".join(code for _, code in _FIELDS))
_META = META_STRUCT


def _span(name: str) -> slice:
    """Where field `name` lies in the frame, computed from the layout above."""
    names = [n for n, _ in _FIELDS]
    at = names.index(name)
    start = struct.calcsize(">" + "".join(code for _, code in _FIELDS[:at]))
    return slice(start, start + struct.calcsize(">" + _FIELDS[at][1]))


# The same layout seen as raw bytes, for the device's hot path, which renumbers a client's
# meta without decoding it: the head (tag, compression, version: what identifies a valid
# meta), device, created_ms, and where the compression byte is.
META_HEAD = slice(0, _span("device").start)
META_DEVICE = _span("device")
META_CREATED = _span("created_ms")
META_COMPRESSION_AT = _span("compression").start
# (head, device, created_ms as bytes, seq) -> the 24 bytes, in one call.
META_RENUMBER = struct.Struct(
    f">{META_HEAD.stop}s{META_DEVICE.stop - META_DEVICE.start}s{META_CREATED.stop - META_CREATED.start}s"
    + _FIELDS[-1][1])
assert META_STRUCT.size == META_RENUMBER.size == META_SIZE, "logjam/constants.py META_SIZE disagrees with the layout"


class Compression(enum.IntEnum):
    """Compression ids carried in meta byte 2."""

    NONE = 0
    ZLIB = 1
    SNAPPY = 2
    LZ4 = 3

    @classmethod
    def parse(cls, name: str | int) -> "Compression":
        """Accept a flag value such as "lz4" or an id such as 3."""
        if isinstance(name, int):
            return cls(name)
        try:
            return cls[name.strip().upper()]
        except KeyError:
            raise ValueError(
                f"unknown compression {name!r}; expected none, zlib, snappy or lz4"
            ) from None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class Meta:
    """Decoded meta frame. `created_ms` is milliseconds since the epoch."""

    compression: int = Compression.NONE
    device: int = 0
    created_ms: int = 0
    seq: int = 0
    version: int = META_VERSION

    def pack(self) -> bytes:
        return _META.pack(
            META_TAG, self.compression, self.version, self.device, self.created_ms, self.seq
        )

    @classmethod
    def unpack(cls, frame: bytes | memoryview) -> "Meta":
        if len(frame) != META_SIZE:
            raise MetaError(f"meta frame must be {META_SIZE} bytes, got {len(frame)}")
        tag, compression, version, device, created_ms, seq = _META.unpack(frame)
        if tag != META_TAG and tag != META_TAG_SWAPPED:
            raise MetaError(f"meta tag is 0x{tag:04X}, expected 0xCABD")
        if version != META_VERSION:
            raise MetaError(f"meta version is {version}, expected {META_VERSION}")
        if compression > Compression.LZ4:
            raise MetaError(f"unknown compression id {compression}")
        return cls(compression, device, created_ms, seq, version)

    @classmethod
    def fresh(cls, compression: int = Compression.NONE, seq: int = 0) -> "Meta":
        """A meta stamped with the current time, as a client sends it."""
        return cls(compression=compression, created_ms=now_ms(), seq=seq)
