"""Sans-IO engine for Pravega's segment-store wire protocol: the server side and a client half.

No sockets here. `SegmentServer.feed(bytes)` turns what a client sent into request
events (appends already reassembled into whole events); `SegmentServer.send(reply)`
turns a reply into bytes. `SegmentClient` is the mirror image, used by the tests and
the benchmark, and able to build both append forms real clients send.

Wire format (docs/protocols/segment.md; field layouts checked against Pravega's own
protocol definitions):

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

The commands and their schemas are in commands.py, the field types in fields.py; this
module holds the framer and the two halves, `SegmentServer` and `SegmentClient`.

Protocol violations raise `SegmentProtocolError` (a RemoteProtocolError); the real
segment store closes the connection on them, and so does the bridge.
`EventNumberWentBackwards` is the one the bridge answers first, with InvalidEventNumber.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Union

from logjam.errors import FrameTooLarge, HeldErrors, LocalProtocolError, RemoteProtocolError

# The vocabulary lives in commands.py and fields.py; importing it here keeps
# `bridges.segment.engine` the one name the bridge, tools and tests use.
from bridges.segment.commands import (  # noqa: F401 (re-exported)
    OLDEST_COMPATIBLE_VERSION, WIRE_VERSION, Schema, CLIENT_PARSES, COMMAND_NAMES, CONDITIONAL_BLOCK_END, MAX_COMMAND_SIZE, NULL_EVENT_NUMBER, PADDING, PARTIAL_EVENT,
    SERVER_PARSES, AppendBlock, AppendBlockEnd, Command, ConditionalAppend, ConditionalCheckFailed, CreateSegment,
    DataAppended, ErrorMessage, GetStreamSegmentInfo, Hello, InvalidEventNumber, KeepAlive, NoSuchSegment,
    OperationUnsupported, Padding, PartialEvent, ReadSegment, SealSegment, SegmentAlreadyExists, SegmentCreated,
    SegmentIsSealed, SegmentRead, SegmentSealed, SetupAppend, StreamSegmentInfo, WrongHost, AppendSetup, decode,
    encode, event_bytes, split_events,
)
from bridges.segment.fields import (  # noqa: F401 (re-exported)
    EVENT, HEADER, HEADER_SIZE, EventNumberWentBackwards, SegmentProtocolError, decode_utf, encode_utf,
)

_I64 = struct.Struct(">q")


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


class SegmentServer(HeldErrors):
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
        self._raise_held()
        self._framer.add(data)
        return self._until_error(self._requests())

    def _requests(self) -> Iterator[Request]:
        for code, body in self._framer.commands():
            event = self._handle(code, body)
            if event is not None:
                yield event

    def send(self, reply: Reply) -> bytes:
        return encode(reply, self.max_command)

    def _handle(self, code: int, body: bytes) -> Request | None:
        cls = SERVER_PARSES.get(code)
        if cls is None:
            name = COMMAND_NAMES[code]
            if self._block is not None:
                raise SegmentProtocolError(f"{name} inside an append block", reason="block_interrupted")
            # Most requests start with their requestId; ConditionalBlockEnd (writer-first) ends with it.
            if code == CONDITIONAL_BLOCK_END:
                request_id = _I64.unpack_from(body, len(body) - 8)[0] if len(body) >= 44 else -1
            else:
                request_id = _I64.unpack_from(body)[0] if len(body) >= 8 else -1
            return Unsupported(code, name, request_id)
        cmd = decode(cls, body)
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


class SegmentClient(HeldErrors):
    """The client half: requests in, bytes out; bytes in, replies out."""

    def __init__(self, max_command: int = MAX_COMMAND_SIZE) -> None:
        self._framer = _Framer(max_command, COMMAND_NAMES)
        self._error: RemoteProtocolError | None = None
        self.max_command = max_command

    def send(self, request: Command) -> bytes:
        return encode(request, self.max_command)

    def feed(self, data: bytes) -> list[Reply]:
        """Add bytes; the replies they complete (the engine contract: logjam.errors.until_error)."""
        self._raise_held()
        self._framer.add(data)
        return self._until_error(self._replies())

    def _replies(self) -> Iterator[Reply]:
        for code, body in self._framer.commands():
            cls = CLIENT_PARSES.get(code)
            if cls is None:
                raise SegmentProtocolError(f"unexpected {COMMAND_NAMES[code]} from the server", reason="unexpected_reply")
            yield decode(cls, body)

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
