"""Sans-IO engine for Pravega's segment-store wire protocol: the server side and a client half.

No sockets here. `SegmentServer.feed(bytes)` turns what a client sent into request
events (appends already reassembled into whole events); `SegmentServer.send(reply)`
turns a reply into bytes. `SegmentClient` is the mirror image, used by the tests and
the benchmark, and able to build both append forms real clients send.

Wire format (interop-notes.md, "Segment append"; field layouts checked against
Pravega's own protocol definitions):

- Every command is `[i32 type][i32 body length][body]`, big-endian. A command is at
  most 16 MiB - 1 bytes including its 8-byte header; the length is checked against
  that bound before the body is buffered. Strings are Java's `writeUTF` (u16 byte
  length, then modified UTF-8); UUIDs are two i64.
- Fields that newer protocol versions appended to a command are optional on input:
  they are read only when bytes remain, and unknown trailing bytes are ignored, so
  older and newer clients both parse.
- Appends come in two forms. The block form is `AppendBlock(writer, block)` followed
  by `AppendBlockEnd(writer, sizeOfWholeEvents, data, numEvents, lastEventNumber,
  requestId)`; the block holds back-to-back EVENT commands and then exactly one
  PARTIAL_EVENT or PADDING command, and the append is rebuilt as
  `block[:sizeOfWholeEvents] + partial + blockEnd.data`. The standalone form (what the
  Rust/Python client sends) is an AppendBlockEnd alone whose data is the whole append.
  `ConditionalAppend` carries one event and the segment offset it must land at.
- Event numbers are per writer and count events: an append of n events ending at
  `lastEventNumber` holds events `lastEventNumber - n + 1 .. lastEventNumber`.

Protocol violations raise `SegmentProtocolError` (a RemoteProtocolError); the real
segment store closes the connection on them, and so does the bridge.
`EventNumberWentBackwards` is the one the bridge answers first, with InvalidEventNumber.
"""

from __future__ import annotations

import re
import struct
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Union

from logjam.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError, until_error

WIRE_VERSION = 17
OLDEST_COMPATIBLE_VERSION = 5
MAX_COMMAND_SIZE = 0xFFFFFF  # 16 MiB - 1, header included
HEADER_SIZE = 8
NULL_EVENT_NUMBER = -(2**63)  # Long.MIN_VALUE: "this writer has never appended here"

HEADER = struct.Struct(">ii")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
U16 = struct.Struct(">H")

# Codes and names from Pravega's WireCommandType; names are reported in OperationUnsupported.
COMMAND_NAMES: dict[int, str] = {
    -127: "HELLO", -1: "PADDING", -2: "PARTIAL_EVENT", -3: "FLUSH_TO_STORAGE", -4: "FLUSHED_TO_STORAGE",
    -5: "LIST_STORAGE_CHUNKS", -6: "STORAGE_CHUNKS_LISTED", 0: "EVENT", 1: "SETUP_APPEND", 2: "APPEND_SETUP",
    3: "APPEND_BLOCK", 4: "APPEND_BLOCK_END", 5: "CONDITIONAL_APPEND", 7: "DATA_APPENDED",
    8: "CONDITIONAL_CHECK_FAILED", 9: "READ_SEGMENT", 10: "SEGMENT_READ", 11: "GET_STREAM_SEGMENT_INFO",
    12: "STREAM_SEGMENT_INFO", 20: "CREATE_SEGMENT", 21: "SEGMENT_CREATED", 28: "SEAL_SEGMENT",
    29: "SEGMENT_SEALED", 30: "DELETE_SEGMENT", 31: "SEGMENT_DELETED", 32: "UPDATE_SEGMENT_POLICY",
    33: "SEGMENT_POLICY_UPDATED", 34: "GET_SEGMENT_ATTRIBUTE", 35: "SEGMENT_ATTRIBUTE",
    36: "UPDATE_SEGMENT_ATTRIBUTE", 37: "SEGMENT_ATTRIBUTE_UPDATED", 38: "TRUNCATE_SEGMENT",
    39: "SEGMENT_TRUNCATED", 40: "CREATE_TRANSIENT_SEGMENT", 41: "LOCATE_OFFSET", 42: "OFFSET_LOCATED",
    50: "WRONG_HOST", 51: "SEGMENT_IS_SEALED", 52: "SEGMENT_ALREADY_EXISTS", 53: "NO_SUCH_SEGMENT",
    55: "INVALID_EVENT_NUMBER", 56: "SEGMENT_IS_TRUNCATED", 57: "OPERATION_UNSUPPORTED", 58: "MERGE_SEGMENTS",
    59: "SEGMENTS_MERGED", 60: "AUTH_TOKEN_CHECK_FAILED", 61: "ERROR_MESSAGE", 68: "GET_TABLE_SEGMENT_INFO",
    69: "TABLE_SEGMENT_INFO", 70: "CREATE_TABLE_SEGMENT", 71: "DELETE_TABLE_SEGMENT",
    74: "UPDATE_TABLE_ENTRIES", 75: "TABLE_ENTRIES_UPDATED", 76: "REMOVE_TABLE_KEYS", 77: "TABLE_KEYS_REMOVED",
    78: "READ_TABLE", 79: "TABLE_READ", 80: "TABLE_SEGMENT_NOT_EMPTY", 81: "TABLE_KEY_DOES_NOT_EXIST",
    82: "TABLE_KEY_BAD_VERSION", 83: "READ_TABLE_KEYS", 84: "TABLE_KEYS_READ", 85: "READ_TABLE_ENTRIES",
    86: "TABLE_ENTRIES_READ", 87: "TABLE_ENTRIES_DELTA_READ", 88: "READ_TABLE_ENTRIES_DELTA",
    89: "CONDITIONAL_BLOCK_END", 90: "MERGE_SEGMENTS_BATCH", 91: "SEGMENTS_BATCH_MERGED", 100: "KEEP_ALIVE",
}

EVENT = 0
PADDING = -1
PARTIAL_EVENT = -2
CONDITIONAL_BLOCK_END = 89


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
    return U16.pack(len(raw)) + raw


def decode_utf(raw: bytes) -> str:
    if raw.isascii():
        if b"\x00" in raw:
            raise SegmentProtocolError("raw NUL byte in a modified UTF-8 string", reason="bad_string")
        return raw.decode("ascii")
    if b"\x00" in raw:
        raise SegmentProtocolError("raw NUL byte in a modified UTF-8 string", reason="bad_string")
    try:
        text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
        # Recombine surrogate pairs (how Java writes characters beyond the BMP).
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeError as e:
        raise SegmentProtocolError(f"invalid modified UTF-8 string: {e}", reason="bad_string") from None


# --- field reader/writer --------------------------------------------------------------------


class _Reader:
    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)

    def _need(self, n: int) -> int:
        pos = self.pos
        if self.end - pos < n:
            raise SegmentProtocolError(f"command body ends early: need {n} more bytes at {pos}", reason="truncated_command")
        self.pos = pos + n
        return pos

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def i32(self) -> int:
        return I32.unpack_from(self.buf, self._need(4))[0]

    def i64(self) -> int:
        return I64.unpack_from(self.buf, self._need(8))[0]

    def opt_i64(self, default: int = -1) -> int:
        return self.i64() if self.remaining >= 8 else default

    def byte(self) -> int:
        b = self.buf[self._need(1)]
        return b - 256 if b > 127 else b

    def boolean(self) -> bool:
        return self.buf[self._need(1)] != 0

    def uuid(self) -> uuid.UUID:
        p = self._need(16)
        return uuid.UUID(bytes=bytes(self.buf[p : p + 16]))

    def utf(self) -> str:
        n = U16.unpack_from(self.buf, self._need(2))[0]
        p = self._need(n)
        return decode_utf(self.buf[p : p + n])

    def opt_utf(self, default: str = "") -> str:
        return self.utf() if self.remaining >= 2 else default

    def raw(self, n: int) -> bytes:
        if n < 0:
            raise SegmentProtocolError(f"negative data length {n}", reason="bad_length")
        p = self._need(n)
        return self.buf[p : p + n]

    def rest(self) -> bytes:
        p, self.pos = self.pos, self.end
        return self.buf[p:]


def _uuid_bytes(u: uuid.UUID) -> bytes:
    return u.bytes  # big-endian 128 bits == two big-endian i64 (most, then least significant)


def _i64(v: int) -> bytes:
    try:
        return I64.pack(v)
    except struct.error:
        raise LocalProtocolError(f"{v} does not fit an i64", reason="bad_field") from None


def _i32(v: int) -> bytes:
    try:
        return I32.pack(v)
    except struct.error:
        raise LocalProtocolError(f"{v} does not fit an i32", reason="bad_field") from None


def _bool(v: bool) -> bytes:
    return b"\x01" if v else b"\x00"


# --- commands -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    high_version: int = WIRE_VERSION
    low_version: int = OLDEST_COMPATIBLE_VERSION
    CODE: ClassVar[int] = -127

    def fields(self) -> bytes:
        return _i32(self.high_version) + _i32(self.low_version)

    @classmethod
    def parse(cls, r: _Reader) -> "Hello":
        return cls(r.i32(), r.i32())

    def compatible(self) -> bool:
        """The peer's range overlaps ours (the segment store's own test)."""
        return not (self.low_version > WIRE_VERSION or self.high_version < OLDEST_COMPATIBLE_VERSION)


@dataclass(frozen=True, slots=True)
class KeepAlive:
    data: bytes = b""
    CODE: ClassVar[int] = 100

    def fields(self) -> bytes:
        return self.data

    @classmethod
    def parse(cls, r: _Reader) -> "KeepAlive":
        return cls(r.rest())


@dataclass(frozen=True, slots=True)
class SetupAppend:
    request_id: int
    writer_id: uuid.UUID
    segment: str
    token: str = ""
    CODE: ClassVar[int] = 1

    def fields(self) -> bytes:
        return _i64(self.request_id) + _uuid_bytes(self.writer_id) + encode_utf(self.segment) + encode_utf(self.token)

    @classmethod
    def parse(cls, r: _Reader) -> "SetupAppend":
        return cls(r.i64(), r.uuid(), r.utf(), r.utf())


@dataclass(frozen=True, slots=True)
class AppendSetup:
    request_id: int
    segment: str
    writer_id: uuid.UUID
    last_event_number: int
    CODE: ClassVar[int] = 2

    def fields(self) -> bytes:
        return _i64(self.request_id) + encode_utf(self.segment) + _uuid_bytes(self.writer_id) + _i64(self.last_event_number)

    @classmethod
    def parse(cls, r: _Reader) -> "AppendSetup":
        return cls(r.i64(), r.utf(), r.uuid(), r.i64())


@dataclass(frozen=True, slots=True)
class AppendBlock:
    writer_id: uuid.UUID
    data: bytes
    CODE: ClassVar[int] = 3

    def fields(self) -> bytes:
        return _uuid_bytes(self.writer_id) + self.data

    @classmethod
    def parse(cls, r: _Reader) -> "AppendBlock":
        return cls(r.uuid(), r.rest())


@dataclass(frozen=True, slots=True)
class AppendBlockEnd:
    writer_id: uuid.UUID
    size_of_whole_events: int
    data: bytes
    num_events: int
    last_event_number: int
    request_id: int = -1
    CODE: ClassVar[int] = 4

    def fields(self) -> bytes:
        return b"".join((
            _uuid_bytes(self.writer_id), _i32(self.size_of_whole_events), _i32(len(self.data)), self.data,
            _i32(self.num_events), _i64(self.last_event_number), _i64(self.request_id),
        ))

    @classmethod
    def parse(cls, r: _Reader) -> "AppendBlockEnd":
        writer, size = r.uuid(), r.i32()
        data = r.raw(r.i32())
        return cls(writer, size, data, r.i32(), r.i64(), r.opt_i64())


@dataclass(frozen=True, slots=True)
class ConditionalAppend:
    writer_id: uuid.UUID
    event_number: int
    expected_offset: int
    payload: bytes
    request_id: int = -1
    CODE: ClassVar[int] = 5

    def fields(self) -> bytes:
        return b"".join((
            _uuid_bytes(self.writer_id), _i64(self.event_number), _i64(self.expected_offset),
            event_bytes(self.payload), _i64(self.request_id),
        ))

    @classmethod
    def parse(cls, r: _Reader) -> "ConditionalAppend":
        writer, number, expected = r.uuid(), r.i64(), r.i64()
        if r.i32() != EVENT:
            raise SegmentProtocolError("ConditionalAppend does not carry an EVENT", reason="bad_event")
        payload = r.raw(r.i32())
        return cls(writer, number, expected, payload, r.opt_i64())


@dataclass(frozen=True, slots=True)
class PartialEvent:
    data: bytes
    CODE: ClassVar[int] = PARTIAL_EVENT

    def fields(self) -> bytes:
        return self.data

    @classmethod
    def parse(cls, r: _Reader) -> "PartialEvent":
        return cls(r.rest())


@dataclass(frozen=True, slots=True)
class Padding:
    length: int
    CODE: ClassVar[int] = PADDING

    def fields(self) -> bytes:
        return bytes(self.length)

    @classmethod
    def parse(cls, r: _Reader) -> "Padding":
        return cls(len(r.rest()))


@dataclass(frozen=True, slots=True)
class DataAppended:
    writer_id: uuid.UUID
    event_number: int
    previous_event_number: int = -1
    request_id: int = -1
    current_segment_write_offset: int = -1
    CODE: ClassVar[int] = 7

    def fields(self) -> bytes:
        return b"".join((
            _uuid_bytes(self.writer_id), _i64(self.event_number), _i64(self.previous_event_number),
            _i64(self.request_id), _i64(self.current_segment_write_offset),
        ))

    @classmethod
    def parse(cls, r: _Reader) -> "DataAppended":
        return cls(r.uuid(), r.i64(), r.opt_i64(), r.opt_i64(), r.opt_i64())


@dataclass(frozen=True, slots=True)
class ConditionalCheckFailed:
    writer_id: uuid.UUID
    event_number: int
    request_id: int = -1
    CODE: ClassVar[int] = 8

    def fields(self) -> bytes:
        return _uuid_bytes(self.writer_id) + _i64(self.event_number) + _i64(self.request_id)

    @classmethod
    def parse(cls, r: _Reader) -> "ConditionalCheckFailed":
        return cls(r.uuid(), r.i64(), r.opt_i64())


@dataclass(frozen=True, slots=True)
class ReadSegment:
    segment: str
    offset: int
    suggested_length: int
    token: str = ""
    request_id: int = -1
    CODE: ClassVar[int] = 9

    def fields(self) -> bytes:
        return b"".join((
            encode_utf(self.segment), _i64(self.offset), _i32(self.suggested_length),
            encode_utf(self.token), _i64(self.request_id),
        ))

    @classmethod
    def parse(cls, r: _Reader) -> "ReadSegment":
        return cls(r.utf(), r.i64(), r.i32(), r.utf(), r.opt_i64())


@dataclass(frozen=True, slots=True)
class SegmentRead:
    segment: str
    offset: int
    at_tail: bool
    end_of_segment: bool
    data: bytes
    request_id: int = -1
    CODE: ClassVar[int] = 10

    def fields(self) -> bytes:
        return b"".join((
            encode_utf(self.segment), _i64(self.offset), _bool(self.at_tail), _bool(self.end_of_segment),
            _i32(len(self.data)), self.data, _i64(self.request_id),
        ))

    @classmethod
    def parse(cls, r: _Reader) -> "SegmentRead":
        segment, offset, tail, end = r.utf(), r.i64(), r.boolean(), r.boolean()
        return cls(segment, offset, tail, end, r.raw(r.i32()), r.opt_i64())


@dataclass(frozen=True, slots=True)
class GetStreamSegmentInfo:
    request_id: int
    segment: str
    token: str = ""
    CODE: ClassVar[int] = 11

    def fields(self) -> bytes:
        return _i64(self.request_id) + encode_utf(self.segment) + encode_utf(self.token)

    @classmethod
    def parse(cls, r: _Reader) -> "GetStreamSegmentInfo":
        return cls(r.i64(), r.utf(), r.utf())


@dataclass(frozen=True, slots=True)
class StreamSegmentInfo:
    request_id: int
    segment: str
    exists: bool
    is_sealed: bool
    is_deleted: bool
    last_modified: int
    write_offset: int
    start_offset: int = 0
    CODE: ClassVar[int] = 12

    def fields(self) -> bytes:
        return b"".join((
            _i64(self.request_id), encode_utf(self.segment), _bool(self.exists), _bool(self.is_sealed),
            _bool(self.is_deleted), _i64(self.last_modified), _i64(self.write_offset), _i64(self.start_offset),
        ))

    @classmethod
    def parse(cls, r: _Reader) -> "StreamSegmentInfo":
        return cls(r.i64(), r.utf(), r.boolean(), r.boolean(), r.boolean(), r.i64(), r.i64(), r.opt_i64(0))


@dataclass(frozen=True, slots=True)
class CreateSegment:
    request_id: int
    segment: str
    target_rate: int = 0
    scale_type: int = 0
    token: str = ""
    rollover_size_bytes: int = 0
    CODE: ClassVar[int] = 20

    def fields(self) -> bytes:
        return b"".join((
            _i64(self.request_id), encode_utf(self.segment), _i32(self.target_rate),
            struct.pack(">b", self.scale_type), encode_utf(self.token), _i64(self.rollover_size_bytes),
        ))

    @classmethod
    def parse(cls, r: _Reader) -> "CreateSegment":
        return cls(r.i64(), r.utf(), r.i32(), r.byte(), r.utf(), r.opt_i64(0))


@dataclass(frozen=True, slots=True)
class SegmentCreated:
    request_id: int
    segment: str
    CODE: ClassVar[int] = 21

    def fields(self) -> bytes:
        return _i64(self.request_id) + encode_utf(self.segment)

    @classmethod
    def parse(cls, r: _Reader) -> "SegmentCreated":
        return cls(r.i64(), r.utf())


@dataclass(frozen=True, slots=True)
class SealSegment:
    request_id: int
    segment: str
    token: str = ""
    CODE: ClassVar[int] = 28

    def fields(self) -> bytes:
        return _i64(self.request_id) + encode_utf(self.segment) + encode_utf(self.token)

    @classmethod
    def parse(cls, r: _Reader) -> "SealSegment":
        return cls(r.i64(), r.utf(), r.utf())


@dataclass(frozen=True, slots=True)
class SegmentSealed:
    request_id: int
    segment: str
    CODE: ClassVar[int] = 29

    def fields(self) -> bytes:
        return _i64(self.request_id) + encode_utf(self.segment)

    @classmethod
    def parse(cls, r: _Reader) -> "SegmentSealed":
        return cls(r.i64(), r.utf())


@dataclass(frozen=True, slots=True)
class WrongHost:
    request_id: int
    segment: str
    correct_host: str = ""
    stack_trace: str = ""
    CODE: ClassVar[int] = 50

    def fields(self) -> bytes:
        return _i64(self.request_id) + encode_utf(self.segment) + encode_utf(self.correct_host) + encode_utf(self.stack_trace)

    @classmethod
    def parse(cls, r: _Reader) -> "WrongHost":
        return cls(r.i64(), r.utf(), r.utf(), r.opt_utf())


@dataclass(frozen=True, slots=True)
class SegmentIsSealed:
    request_id: int
    segment: str
    stack_trace: str = ""
    offset: int = -1
    CODE: ClassVar[int] = 51

    def fields(self) -> bytes:
        return _i64(self.request_id) + encode_utf(self.segment) + encode_utf(self.stack_trace) + _i64(self.offset)

    @classmethod
    def parse(cls, r: _Reader) -> "SegmentIsSealed":
        return cls(r.i64(), r.utf(), r.opt_utf(), r.opt_i64())


@dataclass(frozen=True, slots=True)
class SegmentAlreadyExists:
    request_id: int
    segment: str
    stack_trace: str = ""
    CODE: ClassVar[int] = 52

    def fields(self) -> bytes:
        return _i64(self.request_id) + encode_utf(self.segment) + encode_utf(self.stack_trace)

    @classmethod
    def parse(cls, r: _Reader) -> "SegmentAlreadyExists":
        return cls(r.i64(), r.utf(), r.opt_utf())


@dataclass(frozen=True, slots=True)
class NoSuchSegment:
    request_id: int
    segment: str
    stack_trace: str = ""
    offset: int = -1
    CODE: ClassVar[int] = 53

    def fields(self) -> bytes:
        return _i64(self.request_id) + encode_utf(self.segment) + encode_utf(self.stack_trace) + _i64(self.offset)

    @classmethod
    def parse(cls, r: _Reader) -> "NoSuchSegment":
        return cls(r.i64(), r.utf(), r.opt_utf(), r.opt_i64())


@dataclass(frozen=True, slots=True)
class InvalidEventNumber:
    writer_id: uuid.UUID
    request_id: int
    stack_trace: str = ""
    event_number: int = -1
    CODE: ClassVar[int] = 55

    def fields(self) -> bytes:
        return _uuid_bytes(self.writer_id) + _i64(self.request_id) + encode_utf(self.stack_trace) + _i64(self.event_number)

    @classmethod
    def parse(cls, r: _Reader) -> "InvalidEventNumber":
        return cls(r.uuid(), r.i64(), r.opt_utf(), r.opt_i64())


@dataclass(frozen=True, slots=True)
class OperationUnsupported:
    request_id: int
    operation: str
    stack_trace: str = ""
    CODE: ClassVar[int] = 57

    def fields(self) -> bytes:
        return _i64(self.request_id) + encode_utf(self.operation) + encode_utf(self.stack_trace)

    @classmethod
    def parse(cls, r: _Reader) -> "OperationUnsupported":
        return cls(r.i64(), r.utf(), r.opt_utf())


@dataclass(frozen=True, slots=True)
class ErrorMessage:
    """A generic error; error_code -1 is UNSPECIFIED, 0 is ILLEGAL_ARGUMENT_EXCEPTION."""

    request_id: int
    segment: str
    message: str
    error_code: int = -1
    CODE: ClassVar[int] = 61

    def fields(self) -> bytes:
        return _i64(self.request_id) + encode_utf(self.segment) + encode_utf(self.message) + _i32(self.error_code)

    @classmethod
    def parse(cls, r: _Reader) -> "ErrorMessage":
        return cls(r.i64(), r.utf(), r.utf(), r.i32())


Command = Union[
    Hello, KeepAlive, SetupAppend, AppendSetup, AppendBlock, AppendBlockEnd, ConditionalAppend, PartialEvent,
    Padding, DataAppended, ConditionalCheckFailed, ReadSegment, SegmentRead, GetStreamSegmentInfo,
    StreamSegmentInfo, CreateSegment, SegmentCreated, SealSegment, SegmentSealed, WrongHost, SegmentIsSealed,
    SegmentAlreadyExists, NoSuchSegment, InvalidEventNumber, OperationUnsupported, ErrorMessage,
]

# What a server parses itself, and what a client parses; everything else known is "unsupported".
_SERVER_PARSES: dict[int, type] = {
    c.CODE: c for c in (Hello, KeepAlive, SetupAppend, AppendBlock, AppendBlockEnd, ConditionalAppend,
                        Padding, PartialEvent, ReadSegment, GetStreamSegmentInfo, CreateSegment, SealSegment)
}
_CLIENT_PARSES: dict[int, type] = {
    c.CODE: c for c in (Hello, KeepAlive, AppendSetup, DataAppended, ConditionalCheckFailed, SegmentRead,
                        StreamSegmentInfo, SegmentCreated, SegmentSealed, WrongHost, SegmentIsSealed,
                        SegmentAlreadyExists, NoSuchSegment, InvalidEventNumber, OperationUnsupported, ErrorMessage)
}


def encode(command: Command, max_command: int = MAX_COMMAND_SIZE) -> bytes:
    """One command with its header; refuses to produce one the peer must reject."""
    body = command.fields()
    if HEADER_SIZE + len(body) > max_command:
        raise LocalProtocolError(
            f"{type(command).__name__} of {HEADER_SIZE + len(body)} bytes exceeds {max_command}", reason="command_too_large"
        )
    return HEADER.pack(command.CODE, len(body)) + body


def event_bytes(payload: bytes) -> bytes:
    """One EVENT command: how an event sits in an append and in a segment."""
    return HEADER.pack(EVENT, len(payload)) + payload


def split_events(data: bytes, *, base_offset: int = 0) -> tuple[list[tuple[int, bytes]], int]:
    """Whole EVENT commands in `data` as (offset, payload), and how many bytes they used.

    A trailing incomplete event (a read that stopped mid-event) is left unparsed.
    """
    out: list[tuple[int, bytes]] = []
    pos, end = 0, len(data)
    unpack = HEADER.unpack_from
    while end - pos >= HEADER_SIZE:
        code, n = unpack(data, pos)
        if code != EVENT or n < 0:
            raise SegmentProtocolError(f"expected an EVENT at offset {pos}, found type {code} length {n}", reason="bad_event")
        if end - pos - HEADER_SIZE < n:
            break
        out.append((base_offset + pos, data[pos + HEADER_SIZE : pos + HEADER_SIZE + n]))
        pos += HEADER_SIZE + n
    return out, pos


# --- server-side events ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Append:
    """One append, reassembled: `data` is exactly what goes into the segment (EVENT headers included)."""

    writer_id: uuid.UUID
    segment: str
    data: bytes
    num_events: int
    last_event_number: int
    request_id: int
    payloads: tuple[bytes, ...]
    event_offsets: tuple[int, ...]  # offset of each EVENT header within `data`
    expected_offset: int | None = None  # set for a ConditionalAppend

    @property
    def first_event_number(self) -> int:
        return self.last_event_number - self.num_events + 1


@dataclass(frozen=True, slots=True)
class Unsupported:
    """A request we know by name but do not implement; answer OperationUnsupported."""

    code: int
    name: str
    request_id: int


Request = Union[Hello, KeepAlive, SetupAppend, Append, ReadSegment, GetStreamSegmentInfo, CreateSegment, SealSegment, Unsupported]
Reply = Union[
    Hello, KeepAlive, AppendSetup, DataAppended, ConditionalCheckFailed, SegmentRead, StreamSegmentInfo,
    SegmentCreated, SegmentSealed, WrongHost, SegmentIsSealed, SegmentAlreadyExists, NoSuchSegment,
    InvalidEventNumber, OperationUnsupported, ErrorMessage,
]


class _Framer:
    """Cuts `[type][length][body]` commands out of a byte stream, checking sizes before buffering."""

    def __init__(self, max_command: int, known: dict[int, str]) -> None:
        if not HEADER_SIZE <= max_command <= MAX_COMMAND_SIZE:
            raise LocalProtocolError(f"max_command must be within 8..{MAX_COMMAND_SIZE}", reason="bad_limit")
        self.max_command = max_command
        self._known = known
        self._buf = bytearray()
        self._pos = 0

    def add(self, data: bytes) -> None:
        self._buf += data

    def commands(self) -> Iterator[tuple[int, bytes]]:
        buf = self._buf
        try:
            while len(buf) - self._pos >= HEADER_SIZE:
                code, length = HEADER.unpack_from(buf, self._pos)
                if code not in self._known:
                    raise SegmentProtocolError(f"unknown command type {code}", reason="unknown_command")
                if length < 0:
                    raise SegmentProtocolError(f"negative command length {length}", reason="bad_length")
                if HEADER_SIZE + length > self.max_command:
                    raise FrameTooLarge(
                        f"{self._known[code]} of {HEADER_SIZE + length} bytes exceeds the maximum {self.max_command}"
                    )
                start = self._pos + HEADER_SIZE
                if len(buf) - start < length:
                    return
                with memoryview(buf) as view:
                    body = view[start : start + length].tobytes()
                self._pos = start + length
                yield code, body
        finally:
            if self._pos:
                del buf[: self._pos]
                self._pos = 0

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos


class SegmentServer:
    """The server side of one connection: bytes in, requests out; replies in, bytes out."""

    def __init__(self, max_command: int = MAX_COMMAND_SIZE) -> None:
        self._framer = _Framer(max_command, COMMAND_NAMES)
        self._error: RemoteProtocolError | None = None
        self.max_command = max_command
        # Per writer on this connection: its segment and the last event number it sent.
        self._writers: dict[uuid.UUID, list] = {}
        self._block: AppendBlock | None = None

    @property
    def mid_frame(self) -> bool:
        """Part of a command, or an AppendBlock without its AppendBlockEnd, has arrived
        (the host's --frame-timeout runs)."""
        return self._framer.buffered > 0 or self._block is not None

    def feed(self, data: bytes) -> list[Request]:
        """Add bytes; the requests they complete (the engine contract: logjam.errors.until_error)."""
        if self._error is not None:
            raise self._error
        self._framer.add(data)
        events, error = until_error(self._requests())
        if error is not None:
            self._error = error
            if not events:
                raise error
        return events

    def _requests(self) -> Iterator[Request]:
        for code, body in self._framer.commands():
            event = self._handle(code, body)
            if event is not None:
                yield event

    def send(self, reply: Reply) -> bytes:
        return encode(reply, self.max_command)

    def segment_of(self, writer_id: uuid.UUID) -> str | None:
        entry = self._writers.get(writer_id)
        return entry[0] if entry else None

    def _parse(self, cls: type, body: bytes):  # noqa: ANN202 (returns the parsed command)
        try:
            return cls.parse(_Reader(body))
        except (struct.error, IndexError, ValueError) as e:
            raise SegmentProtocolError(f"malformed {cls.__name__}: {e}", reason="malformed_command") from None

    def _handle(self, code: int, body: bytes) -> Request | None:
        cls = _SERVER_PARSES.get(code)
        if cls is None:
            name = COMMAND_NAMES[code]
            if self._block is not None:
                raise SegmentProtocolError(f"{name} inside an append block", reason="block_interrupted")
            # Most requests start with their requestId; ConditionalBlockEnd (writer-first) ends with it.
            if code == CONDITIONAL_BLOCK_END:
                request_id = I64.unpack_from(body, len(body) - 8)[0] if len(body) >= 44 else -1
            else:
                request_id = I64.unpack_from(body)[0] if len(body) >= 8 else -1
            return Unsupported(code, name, request_id)
        cmd = self._parse(cls, body)
        if self._block is not None and cls in (SetupAppend, AppendBlock, ConditionalAppend, Padding, PartialEvent):
            raise SegmentProtocolError(f"{cls.__name__} before the open block's AppendBlockEnd", reason="block_interrupted")
        if cls is AppendBlockEnd:
            return self._block_end(cmd)
        if cls is AppendBlock:
            self._writer(cmd.writer_id)
            self._block = cmd
            return None
        if cls is ConditionalAppend:
            return self._conditional(cmd)
        if cls is Padding:
            return None
        if cls is PartialEvent:
            raise SegmentProtocolError("PARTIAL_EVENT outside an append block", reason="stray_partial_event")
        if cls is SetupAppend:
            self._writers[cmd.writer_id] = [cmd.segment, NULL_EVENT_NUMBER]
        return cmd

    def _writer(self, writer_id: uuid.UUID) -> list:
        entry = self._writers.get(writer_id)
        if entry is None:
            raise SegmentProtocolError(f"writer {writer_id} appended before SetupAppend", reason="no_setup_append")
        return entry

    def _advance(self, entry: list, writer_id: uuid.UUID, last: int, request_id: int) -> None:
        if last < entry[1]:
            raise EventNumberWentBackwards(
                f"writer {writer_id}: event number {last} is behind {entry[1]}",
                writer_id=writer_id, event_number=last, request_id=request_id,
            )
        entry[1] = last

    def _block_end(self, end: AppendBlockEnd) -> Append:
        entry = self._writer(end.writer_id)
        block, self._block = self._block, None
        if end.num_events <= 0:
            raise SegmentProtocolError(f"numEvents must be positive, got {end.num_events}", reason="bad_event_count")
        if block is None:
            data = end.data
        else:
            if block.writer_id != end.writer_id:
                raise SegmentProtocolError("AppendBlockEnd writer differs from its AppendBlock's", reason="writer_mismatch")
            whole = end.size_of_whole_events
            if not 0 <= whole <= len(block.data):
                raise SegmentProtocolError(
                    f"sizeOfWholeEvents {whole} outside the block's {len(block.data)} bytes", reason="bad_block_size"
                )
            tail = block.data[whole:]
            if not tail:
                # The segment store would silently drop such data; refusing it loses nothing unacked.
                if end.data:
                    raise SegmentProtocolError("AppendBlockEnd carries data but the block has no PartialEvent", reason="bad_block_tail")
                data = block.data
            else:
                if len(tail) < HEADER_SIZE:
                    raise SegmentProtocolError("block ends in a torn command header", reason="bad_block_tail")
                code, n = HEADER.unpack_from(tail)
                if n < 0 or n > len(tail) - HEADER_SIZE:
                    raise SegmentProtocolError("block's trailing command overruns the block", reason="bad_block_tail")
                if code == PARTIAL_EVENT:
                    data = b"".join((block.data[:whole], tail[HEADER_SIZE : HEADER_SIZE + n], end.data))
                elif code == PADDING:
                    if end.data:
                        raise SegmentProtocolError("data in an AppendBlockEnd after Padding", reason="bad_block_tail")
                    data = block.data[:whole]
                else:
                    raise SegmentProtocolError(
                        f"block ends with {COMMAND_NAMES.get(code, code)}, not a partial event or padding",
                        reason="bad_block_tail",
                    )
        events, used = split_events(data)
        if used != len(data):
            raise SegmentProtocolError("append ends in the middle of an event", reason="torn_event")
        if len(events) != end.num_events:
            raise SegmentProtocolError(
                f"append holds {len(events)} events but numEvents says {end.num_events}", reason="bad_event_count"
            )
        self._advance(entry, end.writer_id, end.last_event_number, end.request_id)
        return Append(
            end.writer_id, entry[0], data, end.num_events, end.last_event_number, end.request_id,
            tuple(p for _, p in events), tuple(o for o, _ in events),
        )

    def _conditional(self, ca: ConditionalAppend) -> Append:
        entry = self._writer(ca.writer_id)
        self._advance(entry, ca.writer_id, ca.event_number, ca.request_id)
        return Append(
            ca.writer_id, entry[0], event_bytes(ca.payload), 1, ca.event_number, ca.request_id,
            (ca.payload,), (0,), ca.expected_offset,
        )


class SegmentClient:
    """The client half: requests in, bytes out; bytes in, replies out."""

    def __init__(self, max_command: int = MAX_COMMAND_SIZE) -> None:
        self._framer = _Framer(max_command, COMMAND_NAMES)
        self._error: RemoteProtocolError | None = None
        self.max_command = max_command

    def send(self, request: Command) -> bytes:
        return encode(request, self.max_command)

    def feed(self, data: bytes) -> list[Reply]:
        """Add bytes; the replies they complete (the engine contract: logjam.errors.until_error)."""
        if self._error is not None:
            raise self._error
        self._framer.add(data)
        events, error = until_error(self._replies())
        if error is not None:
            self._error = error
            if not events:
                raise error
        return events

    def _replies(self) -> Iterator[Reply]:
        for code, body in self._framer.commands():
            cls = _CLIENT_PARSES.get(code)
            if cls is None:
                raise SegmentProtocolError(f"unexpected {COMMAND_NAMES[code]} from the server", reason="unexpected_reply")
            try:
                yield cls.parse(_Reader(body))
            except (struct.error, IndexError, ValueError) as e:
                raise SegmentProtocolError(f"malformed {cls.__name__}: {e}", reason="malformed_command") from None

    def append(
        self,
        writer_id: uuid.UUID,
        payloads: Sequence[bytes],
        last_event_number: int,
        request_id: int = -1,
        *,
        split_at: int | None = None,
        padding: int | None = None,
    ) -> bytes:
        """The bytes of one append of `payloads`.

        Without `split_at`: the standalone form (AppendBlockEnd alone), as the Rust client sends.
        With `split_at` (a byte position in the serialized events): the block form, the block
        holding the whole events before it, then a PartialEvent up to `split_at` whose rest
        travels in AppendBlockEnd. If `split_at` falls on an event boundary and `padding` is
        given, the block ends with a Padding of that many bytes instead.
        """
        if not payloads:
            raise LocalProtocolError("an append needs at least one event", reason="empty_append")
        events = [event_bytes(p) for p in payloads]
        data = b"".join(events)
        n = len(payloads)
        if split_at is None:
            return self.send(AppendBlockEnd(writer_id, len(data), data, n, last_event_number, request_id))
        if not 0 <= split_at <= len(data):
            raise LocalProtocolError(f"split_at {split_at} outside 0..{len(data)}", reason="bad_split")
        whole = 0
        for ev in events:
            if whole + len(ev) > split_at:
                break
            whole += len(ev)
        if split_at == whole and padding is not None:
            tail = encode(Padding(padding), self.max_command)
        else:
            tail = encode(PartialEvent(data[whole:split_at]), self.max_command)
        block = self.send(AppendBlock(writer_id, data[:whole] + tail))
        return block + self.send(AppendBlockEnd(writer_id, whole, data[split_at:], n, last_event_number, request_id))
