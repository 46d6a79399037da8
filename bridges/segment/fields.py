"""The segment protocol's field types, and the errors its codec raises.

A command is described by a schema: its field names, in wire order, each with one of
the types below (kafka-python's `kafka/protocol/types.py` is the model). A type knows
how to read its value from a `Reader` and how to write it; commands.py holds the
schemas and the one generic encoder and decoder that walk them.

On input, fields that newer protocol versions appended to a command are `Trailing`:
read only when bytes remain, else their default. On output every field is written.
Strings are Java's `writeUTF` (u16 byte length, then modified UTF-8); UUIDs are two i64.
"""

from __future__ import annotations

import re
import struct
import uuid
from typing import Any, Protocol

from logjam.errors import LocalProtocolError, RemoteProtocolError

HEADER = struct.Struct(">ii")  # every command: [i32 type][i32 body length]
HEADER_SIZE = HEADER.size
EVENT = 0


class SegmentProtocolError(RemoteProtocolError):
    """The peer broke the segment-store wire protocol; the connection is closed."""

    reason = "segment_protocol"


class EventNumberWentBackwards(SegmentProtocolError):
    """An append's event number is behind what this writer already sent."""

    reason = "invalid_event_number"

    def __init__(self, message: str, *, writer_id: uuid.UUID, event_number: int, request_id: int) -> None:
        super().__init__(message)
        self.writer_id = writer_id
        self.event_number = event_number
        self.request_id = request_id


# --- modified UTF-8 (Java DataOutput.writeUTF) --------------------------------------------

_U16 = struct.Struct(">H")
_NON_BMP = re.compile("[\U00010000-\U0010ffff]")


def _to_surrogates(m: re.Match[str]) -> str:
    c = ord(m.group()) - 0x10000
    return chr(0xD800 + (c >> 10)) + chr(0xDC00 + (c & 0x3FF))


def encode_utf(text: str) -> bytes:
    """Java's modified UTF-8: NUL is C0 80 and characters beyond the BMP are surrogate pairs."""
    if text.isascii() and "\x00" not in text:
        raw = text.encode("ascii")
    else:
        raw = _NON_BMP.sub(_to_surrogates, text).encode("utf-8", "surrogatepass").replace(b"\x00", b"\xc0\x80")
    if len(raw) > 0xFFFF:
        raise LocalProtocolError(f"string of {len(raw)} bytes does not fit a u16 length", reason="string_too_long")
    return _U16.pack(len(raw)) + raw


def decode_utf(raw: bytes) -> str:
    if b"\x00" in raw:
        raise SegmentProtocolError("raw NUL byte in a modified UTF-8 string", reason="bad_string")
    if raw.isascii():
        return raw.decode("ascii")
    try:
        text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
        # Recombine surrogate pairs (how Java writes characters beyond the BMP).
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeError as e:
        raise SegmentProtocolError(f"invalid modified UTF-8 string: {e}", reason="bad_string") from None


# --- reading a command body -----------------------------------------------------------------


class Reader:
    """A cursor over one command body; running off its end is a `truncated_command`."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def take(self, n: int) -> int:
        """Claim the next `n` bytes; returns where they start."""
        pos = self.pos
        if self.end - pos < n:
            raise SegmentProtocolError(f"command body ends early: need {n} more bytes at {pos}", reason="truncated_command")
        self.pos = pos + n
        return pos


# --- the field types ------------------------------------------------------------------------


class Field(Protocol):
    """What a schema entry is: a reader and a writer for one value."""

    min_size: int

    def read(self, r: Reader) -> Any: ...

    def write(self, value: Any) -> bytes: ...


class _Fixed:
    """A big-endian integer of fixed width."""

    __slots__ = ("min_size", "_struct", "_name")

    def __init__(self, fmt: str, name: str) -> None:
        self._struct = struct.Struct(fmt)
        self.min_size = self._struct.size
        self._name = name

    def read(self, r: Reader) -> int:
        return self._struct.unpack_from(r.buf, r.take(self.min_size))[0]

    def write(self, value: int) -> bytes:
        try:
            return self._struct.pack(value)
        except struct.error:
            raise LocalProtocolError(f"{value} does not fit an {self._name}", reason="bad_field") from None


Int8 = _Fixed(">b", "i8")
Int32 = _Fixed(">i", "i32")
Int64 = _Fixed(">q", "i64")


class _Boolean:
    min_size = 1

    def read(self, r: Reader) -> bool:
        return r.buf[r.take(1)] != 0

    def write(self, value: bool) -> bytes:
        return b"\x01" if value else b"\x00"


class _Uuid:
    min_size = 16

    def read(self, r: Reader) -> uuid.UUID:
        p = r.take(16)
        return uuid.UUID(bytes=bytes(r.buf[p : p + 16]))

    def write(self, value: uuid.UUID) -> bytes:
        return value.bytes  # big-endian 128 bits == two big-endian i64 (most, then least significant)


class _Utf:
    min_size = 2

    def read(self, r: Reader) -> str:
        n = _U16.unpack_from(r.buf, r.take(2))[0]
        p = r.take(n)
        return decode_utf(r.buf[p : p + n])

    def write(self, value: str) -> bytes:
        return encode_utf(value)


class _Bytes:
    """An i32 length, then that many bytes."""

    min_size = 4

    def read(self, r: Reader) -> bytes:
        n = Int32.read(r)
        if n < 0:
            raise SegmentProtocolError(f"negative data length {n}", reason="bad_length")
        p = r.take(n)
        return r.buf[p : p + n]

    def write(self, value: bytes) -> bytes:
        return Int32.write(len(value)) + value


class _Rest:
    """Everything left in the body, unframed (block contents, keep-alive data)."""

    min_size = 0

    def read(self, r: Reader) -> bytes:
        p = r.take(r.remaining)
        return r.buf[p:]

    def write(self, value: bytes) -> bytes:
        return value


class _PaddingLength:
    """The rest of the body as a count of filler bytes (Padding's only field)."""

    min_size = 0

    def read(self, r: Reader) -> int:
        n = r.remaining
        r.take(n)
        return n

    def write(self, value: int) -> bytes:
        return bytes(value)


class _Event:
    """One embedded EVENT command, `[i32 0][i32 length][payload]`; the value is the payload."""

    min_size = HEADER_SIZE

    def read(self, r: Reader) -> bytes:
        if Int32.read(r) != EVENT:
            raise SegmentProtocolError("expected an embedded EVENT command", reason="bad_event")
        return Bytes.read(r)

    def write(self, value: bytes) -> bytes:
        return HEADER.pack(EVENT, len(value)) + value


class Trailing:
    """A field newer protocol versions appended: read only when bytes remain for it."""

    __slots__ = ("field", "default", "min_size")

    def __init__(self, field: Field, default: Any) -> None:
        self.field = field
        self.default = default
        self.min_size = field.min_size

    def read(self, r: Reader) -> Any:
        return self.field.read(r) if r.remaining >= self.min_size else self.default

    def write(self, value: Any) -> bytes:
        return self.field.write(value)


Boolean = _Boolean()
Uuid = _Uuid()
Utf = _Utf()
Bytes = _Bytes()
Rest = _Rest()
PaddingLength = _PaddingLength()
Event = _Event()
