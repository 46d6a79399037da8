"""The segment-store commands this mesh speaks, each described by one schema.

A command is a frozen dataclass with a `CODE` (Pravega's WireCommandType) and a
`SCHEMA`: its fields in wire order, each with a type from fields.py. `encode` and
`decode` are the one encoder and decoder; no command carries code of its own. The
schema's names must be the dataclass's fields in order, and `_register` checks that
when this module is imported, so a schema cannot drift from its class.

Field layouts were checked against Pravega's own protocol definitions; docs/protocols/segment.md
("Which protocol") says why this is the protocol real clients speak, not the early design note.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar, Union

from logjam.errors import LocalProtocolError

from bridges.segment.fields import (
    EVENT, HEADER, HEADER_SIZE, Boolean, Bytes, Event, Field, Int8, Int32, Int64, PaddingLength, Reader, Rest,
    SegmentProtocolError, Trailing, Utf, Uuid,
)

WIRE_VERSION = 17
OLDEST_COMPATIBLE_VERSION = 5
MAX_COMMAND_SIZE = 0xFFFFFF  # 16 MiB - 1, header included
NULL_EVENT_NUMBER = -(2**63)  # Long.MIN_VALUE: "this writer has never appended here"

PADDING = -1
PARTIAL_EVENT = -2
CONDITIONAL_BLOCK_END = 89

Schema = tuple[tuple[str, Field], ...]

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
    39: "SEGMENT_TRUNCATED", 40: "CREATE_TRANSIENT_SEGMENT", 41: "LOCATE_LONG", 42: "OFFSET_LOCATED",
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

# The trailing fields newer versions added, with what a peer too old to send them means.
_LONG = Trailing(Int64, -1)
_TEXT = Trailing(Utf, "")


# --- requests (and the two commands both sides send) -----------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    high_version: int = WIRE_VERSION
    low_version: int = OLDEST_COMPATIBLE_VERSION
    CODE: ClassVar[int] = -127
    SCHEMA: ClassVar[Schema] = (("high_version", Int32), ("low_version", Int32))

    def compatible(self) -> bool:
        """The peer's range overlaps ours (the segment store's own test)."""
        return not (self.low_version > WIRE_VERSION or self.high_version < OLDEST_COMPATIBLE_VERSION)


@dataclass(frozen=True, slots=True)
class KeepAlive:
    data: bytes = b""
    CODE: ClassVar[int] = 100
    SCHEMA: ClassVar[Schema] = (("data", Rest),)


@dataclass(frozen=True, slots=True)
class SetupAppend:
    request_id: int
    writer_id: uuid.UUID
    segment: str
    token: str = ""
    CODE: ClassVar[int] = 1
    SCHEMA: ClassVar[Schema] = (("request_id", Int64), ("writer_id", Uuid), ("segment", Utf), ("token", Utf))


@dataclass(frozen=True, slots=True)
class AppendBlock:
    writer_id: uuid.UUID
    data: bytes
    CODE: ClassVar[int] = 3
    SCHEMA: ClassVar[Schema] = (("writer_id", Uuid), ("data", Rest))


@dataclass(frozen=True, slots=True)
class AppendBlockEnd:
    writer_id: uuid.UUID
    size_of_whole_events: int
    data: bytes
    num_events: int
    last_event_number: int
    request_id: int = -1
    CODE: ClassVar[int] = 4
    SCHEMA: ClassVar[Schema] = (
        ("writer_id", Uuid), ("size_of_whole_events", Int32), ("data", Bytes), ("num_events", Int32),
        ("last_event_number", Int64), ("request_id", _LONG),
    )


@dataclass(frozen=True, slots=True)
class ConditionalAppend:
    writer_id: uuid.UUID
    event_number: int
    expected_offset: int
    payload: bytes
    request_id: int = -1
    CODE: ClassVar[int] = 5
    SCHEMA: ClassVar[Schema] = (
        ("writer_id", Uuid), ("event_number", Int64), ("expected_offset", Int64), ("payload", Event),
        ("request_id", _LONG),
    )


@dataclass(frozen=True, slots=True)
class PartialEvent:
    data: bytes
    CODE: ClassVar[int] = PARTIAL_EVENT
    SCHEMA: ClassVar[Schema] = (("data", Rest),)


@dataclass(frozen=True, slots=True)
class Padding:
    length: int
    CODE: ClassVar[int] = PADDING
    SCHEMA: ClassVar[Schema] = (("length", PaddingLength),)


@dataclass(frozen=True, slots=True)
class ReadSegment:
    segment: str
    offset: int
    suggested_length: int
    token: str = ""
    request_id: int = -1
    CODE: ClassVar[int] = 9
    SCHEMA: ClassVar[Schema] = (
        ("segment", Utf), ("offset", Int64), ("suggested_length", Int32), ("token", Utf), ("request_id", _LONG),
    )


@dataclass(frozen=True, slots=True)
class GetStreamSegmentInfo:
    request_id: int
    segment: str
    token: str = ""
    CODE: ClassVar[int] = 11
    SCHEMA: ClassVar[Schema] = (("request_id", Int64), ("segment", Utf), ("token", Utf))


@dataclass(frozen=True, slots=True)
class CreateSegment:
    request_id: int
    segment: str
    target_rate: int = 0
    scale_type: int = 0
    token: str = ""
    rollover_size_bytes: int = 0
    CODE: ClassVar[int] = 20
    SCHEMA: ClassVar[Schema] = (
        ("request_id", Int64), ("segment", Utf), ("target_rate", Int32), ("scale_type", Int8), ("token", Utf),
        ("rollover_size_bytes", Trailing(Int64, 0)),
    )


@dataclass(frozen=True, slots=True)
class SealSegment:
    request_id: int
    segment: str
    token: str = ""
    CODE: ClassVar[int] = 28
    SCHEMA: ClassVar[Schema] = (("request_id", Int64), ("segment", Utf), ("token", Utf))


# --- replies ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendSetup:
    request_id: int
    segment: str
    writer_id: uuid.UUID
    last_event_number: int
    CODE: ClassVar[int] = 2
    SCHEMA: ClassVar[Schema] = (
        ("request_id", Int64), ("segment", Utf), ("writer_id", Uuid), ("last_event_number", Int64),
    )


@dataclass(frozen=True, slots=True)
class DataAppended:
    writer_id: uuid.UUID
    event_number: int
    previous_event_number: int = -1
    request_id: int = -1
    current_segment_write_offset: int = -1
    CODE: ClassVar[int] = 7
    SCHEMA: ClassVar[Schema] = (
        ("writer_id", Uuid), ("event_number", Int64), ("previous_event_number", _LONG),
        ("request_id", _LONG), ("current_segment_write_offset", _LONG),
    )


@dataclass(frozen=True, slots=True)
class ConditionalCheckFailed:
    writer_id: uuid.UUID
    event_number: int
    request_id: int = -1
    CODE: ClassVar[int] = 8
    SCHEMA: ClassVar[Schema] = (("writer_id", Uuid), ("event_number", Int64), ("request_id", _LONG))


@dataclass(frozen=True, slots=True)
class SegmentRead:
    segment: str
    offset: int
    at_tail: bool
    end_of_segment: bool
    data: bytes
    request_id: int = -1
    CODE: ClassVar[int] = 10
    SCHEMA: ClassVar[Schema] = (
        ("segment", Utf), ("offset", Int64), ("at_tail", Boolean), ("end_of_segment", Boolean), ("data", Bytes),
        ("request_id", _LONG),
    )


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
    SCHEMA: ClassVar[Schema] = (
        ("request_id", Int64), ("segment", Utf), ("exists", Boolean), ("is_sealed", Boolean),
        ("is_deleted", Boolean), ("last_modified", Int64), ("write_offset", Int64),
        ("start_offset", Trailing(Int64, 0)),
    )


@dataclass(frozen=True, slots=True)
class SegmentCreated:
    request_id: int
    segment: str
    CODE: ClassVar[int] = 21
    SCHEMA: ClassVar[Schema] = (("request_id", Int64), ("segment", Utf))


@dataclass(frozen=True, slots=True)
class SegmentSealed:
    request_id: int
    segment: str
    CODE: ClassVar[int] = 29
    SCHEMA: ClassVar[Schema] = (("request_id", Int64), ("segment", Utf))


@dataclass(frozen=True, slots=True)
class WrongHost:
    request_id: int
    segment: str
    correct_host: str = ""
    stack_trace: str = ""
    CODE: ClassVar[int] = 50
    SCHEMA: ClassVar[Schema] = (
        ("request_id", Int64), ("segment", Utf), ("correct_host", Utf), ("stack_trace", _TEXT),
    )


@dataclass(frozen=True, slots=True)
class SegmentIsSealed:
    request_id: int
    segment: str
    stack_trace: str = ""
    offset: int = -1
    CODE: ClassVar[int] = 51
    SCHEMA: ClassVar[Schema] = (
        ("request_id", Int64), ("segment", Utf), ("stack_trace", _TEXT), ("offset", _LONG),
    )


@dataclass(frozen=True, slots=True)
class SegmentAlreadyExists:
    request_id: int
    segment: str
    stack_trace: str = ""
    CODE: ClassVar[int] = 52
    SCHEMA: ClassVar[Schema] = (("request_id", Int64), ("segment", Utf), ("stack_trace", _TEXT))


@dataclass(frozen=True, slots=True)
class NoSuchSegment:
    request_id: int
    segment: str
    stack_trace: str = ""
    offset: int = -1
    CODE: ClassVar[int] = 53
    SCHEMA: ClassVar[Schema] = (
        ("request_id", Int64), ("segment", Utf), ("stack_trace", _TEXT), ("offset", _LONG),
    )


@dataclass(frozen=True, slots=True)
class InvalidEventNumber:
    writer_id: uuid.UUID
    request_id: int
    stack_trace: str = ""
    event_number: int = -1
    CODE: ClassVar[int] = 55
    SCHEMA: ClassVar[Schema] = (
        ("writer_id", Uuid), ("request_id", Int64), ("stack_trace", _TEXT), ("event_number", _LONG),
    )


@dataclass(frozen=True, slots=True)
class OperationUnsupported:
    request_id: int
    operation: str
    stack_trace: str = ""
    CODE: ClassVar[int] = 57
    SCHEMA: ClassVar[Schema] = (("request_id", Int64), ("operation", Utf), ("stack_trace", _TEXT))


@dataclass(frozen=True, slots=True)
class ErrorMessage:
    """A generic error; error_code -1 is UNSPECIFIED, 0 is ILLEGAL_ARGUMENT_EXCEPTION."""

    request_id: int
    segment: str
    message: str
    error_code: int = -1
    CODE: ClassVar[int] = 61
    SCHEMA: ClassVar[Schema] = (("request_id", Int64), ("segment", Utf), ("message", Utf), ("error_code", Int32))


Command = Union[
    Hello, KeepAlive, SetupAppend, AppendSetup, AppendBlock, AppendBlockEnd, ConditionalAppend, PartialEvent,
    Padding, DataAppended, ConditionalCheckFailed, ReadSegment, SegmentRead, GetStreamSegmentInfo,
    StreamSegmentInfo, CreateSegment, SegmentCreated, SealSegment, SegmentSealed, WrongHost, SegmentIsSealed,
    SegmentAlreadyExists, NoSuchSegment, InvalidEventNumber, OperationUnsupported, ErrorMessage,
]


def _register(*classes: type) -> dict[int, type]:
    """Code -> class, after checking each schema names its class's fields in order."""
    table: dict[int, type] = {}
    for cls in classes:
        names = tuple(f.name for f in dataclasses.fields(cls))
        if names != tuple(name for name, _ in cls.SCHEMA):
            raise TypeError(f"{cls.__name__}.SCHEMA does not list its fields {names} in order")
        if COMMAND_NAMES.get(cls.CODE) is None:
            raise TypeError(f"{cls.__name__}.CODE {cls.CODE} is not a known command type")
        table[cls.CODE] = cls
    return table


# What a server parses itself, and what a client parses; everything else known is "unsupported".
SERVER_PARSES = _register(
    Hello, KeepAlive, SetupAppend, AppendBlock, AppendBlockEnd, ConditionalAppend, Padding, PartialEvent,
    ReadSegment, GetStreamSegmentInfo, CreateSegment, SealSegment,
)
CLIENT_PARSES = _register(
    Hello, KeepAlive, AppendSetup, DataAppended, ConditionalCheckFailed, SegmentRead, StreamSegmentInfo,
    SegmentCreated, SegmentSealed, WrongHost, SegmentIsSealed, SegmentAlreadyExists, NoSuchSegment,
    InvalidEventNumber, OperationUnsupported, ErrorMessage,
)


def encode(command: Command, max_command: int = MAX_COMMAND_SIZE) -> bytes:
    """One command with its header; refuses to produce one the peer must reject."""
    body = b"".join([field.write(getattr(command, name)) for name, field in command.SCHEMA])
    if HEADER_SIZE + len(body) > max_command:
        raise LocalProtocolError(
            f"{type(command).__name__} of {HEADER_SIZE + len(body)} bytes exceeds {max_command}", reason="command_too_large"
        )
    return HEADER.pack(command.CODE, len(body)) + body


def decode(cls: type, body: bytes) -> Any:
    """One command body read by `cls.SCHEMA`; unknown trailing bytes (a newer peer's fields) are ignored."""
    r = Reader(body)
    try:
        return cls(*[field.read(r) for _, field in cls.SCHEMA])
    except (struct.error, IndexError, ValueError) as e:
        raise SegmentProtocolError(f"malformed {cls.__name__}: {e}", reason="malformed_command") from None


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
