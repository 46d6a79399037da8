"""Sans-IO engine for the Log Courier protocol: the server side and a client half.

No sockets here. `CourierServer.feed(bytes)` turns what a client sent into events;
`CourierServer.send(reply)` turns a reply into bytes. `CourierClient` is the mirror
image, used by the tests and by anything that wants to ship to a Courier server.
The framing, handshake and payload encoding are in wire.py (which describes the wire
format), the events and replies in messages.py; this module holds the two halves.

An EVNT message ends where its zlib stream ends, so the engine cannot know the size up
front: it inflates incrementally and never holds the payload whole. JDAT payloads are
decoded incrementally too: events come out as their compressed bytes arrive, so a
10 MiB JDAT is never buffered whole either.

Limits are checked before anything is allocated or inflated: a message length
against `max_message`, every record length against `max_event`, and the inflated
size of one payload against `max_decompressed`. Inflation runs in steps of at most
`INFLATE_STEP` output bytes, so a zlib bomb costs one step of memory.

A tiny input must not become an unbounded number of events: a payload may hold at most
`max_events` records, checked before the record is yielded, so nothing past the limit
reaches the caller. A zero-length record is an event like any text that is not JSON (the
`_unmarshal_failure` wrapper, as for any record that is not valid JSON): refusing it bounded nothing
that a payload of two-byte `{}` records does not reach too, at the same deflate ratio.

`feed()` appends the bytes and returns a list of at most `FEED_EVENTS` events (the engine
contract, docs/architecture.md); `feed(b"")` returns the next ones, and the adapter calls
it until it returns none. The state machine stays suspended in between, so a caller whose
downstream is slow stops the engine inflating ahead simply by not asking for more.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

import orjson

from bridges.courier.messages import (
    Ack, AckReceived, ClientEvent, EventReceived, Hello, PayloadEnded, PayloadStarted, Ping, Pong, PongReceived,
    ServerEvent, ServerReply, Unknown, UnknownMessage, UnknownReceived, Version, VersionReceived,
)
from bridges.courier.wire import (
    ACKN_BODY, CLIENT_ID, DEFAULT_MAX_DECOMPRESSED, DEFAULT_MAX_EVENT, DEFAULT_MAX_MESSAGE, DEFAULT_MAX_PAYLOAD_EVENTS,
    HANDSHAKE_MAX, HEADER, NONCE_SIZE, STREAM_LENGTH, T_ACKN, T_EVNT, T_HELO, T_JDAT, T_PING, T_PONG, T_UNKN, T_VERS,
    U32, VERSION, CourierProtocolError, Handshake, check_nonce, encode_evnt, encode_jdat, event_body, header,
)
from logjam.errors import (
    CompressionError,
    DecompressedTooLarge,
    FrameTooLarge,
    LocalProtocolError,
    RemoteProtocolError,
)
from logjam.errors import HeldErrors

INFLATE_STEP = 256 * 1024
FEED_EVENTS = 256  # events one feed() returns at most (see CourierServer._bounded)


# ------------------------------------------------------------------ server engine

class _State(enum.Enum):
    HEADER = 1
    HANDSHAKE = 2
    SKIP = 3
    NONCE = 4
    DATA = 5
    ERROR = 6


class CourierServer(HeldErrors):
    """The server side of one Courier connection."""

    def __init__(
        self,
        *,
        max_message: int = DEFAULT_MAX_MESSAGE,
        max_event: int = DEFAULT_MAX_EVENT,
        max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
        max_events: int = DEFAULT_MAX_PAYLOAD_EVENTS,
    ) -> None:
        self.max_message = max_message
        self.max_events = max_events
        self.inflated_total = 0  # bytes payloads inflated to, over the connection's life
        self.max_event = min(max_event, max_decompressed)
        self.max_decompressed = max_decompressed
        self.handshake: Handshake | None = None  # set once a HELO arrived
        self.messages = 0  # messages fully or partly seen, for "HELO must come first"
        self._buf = bytearray()
        self._state = _State.HEADER
        self._error: RemoteProtocolError | None = None
        self._events: Iterator[ServerEvent] | None = None  # the state machine, suspended between feeds
        self._type = b""
        self._length = 0
        self._skip = 0
        # The payload being decoded.
        self._kind = ""
        self._nonce = b""
        self._remaining: int | None = None  # JDAT: compressed bytes left; EVNT: None
        self._inflater: Any = None
        self._plain = bytearray()  # inflated bytes not yet parsed into records (one partial record at most)
        self._inflated = 0
        self._index = 0
        self._sent_version = False

    @property
    def mid_frame(self) -> bool:
        """Part of a message (a header, a handshake, a payload) has arrived, not all of it
        (the host's --frame-timeout runs)."""
        return self._state is not _State.HEADER or len(self._buf) > 0

    def feed(self, data: bytes) -> list[ServerEvent]:
        """Append `data`; the events it completes, at most FEED_EVENTS of them (the engine
        contract: logjam.errors.until_error; `feed(b"")` returns the next ones)."""
        self._raise_held()
        self._buf += data
        return self._until_error(self._bounded())

    def _bounded(self) -> Iterator[ServerEvent]:
        """Up to FEED_EVENTS events of the state machine, which stays suspended in between.

        A read of compressed bytes can inflate to thousands of events; handing them over a
        few hundred at a time keeps their bodies in the CPU's caches and lets the adapter
        apply back-pressure before the engine inflates further (measured: 64 KiB feeds that
        returned every event ran the decode-only benchmark at 0.75x of 2 KiB feeds).
        """
        left = FEED_EVENTS
        while left:
            fresh = self._events is None
            if fresh:
                self._events = self._run()
            took = 0
            for ev in islice(self._events, left):  # type: ignore[arg-type]
                took += 1
                yield ev
            left -= took
            if left:  # the run ended: it is out of bytes, or it ran before the latest ones arrived
                self._events = None
                if fresh and not took:
                    return

    def send(self, reply: ServerReply) -> bytes:
        if isinstance(reply, Ack):
            check_nonce(reply.nonce)
            if not 0 <= reply.sequence <= 0xFFFFFFFF:
                raise LocalProtocolError(f"ACKN sequence {reply.sequence} out of range", reason="bad_sequence")
            return header(T_ACKN, ACKN_BODY.size) + ACKN_BODY.pack(reply.nonce, reply.sequence)
        if isinstance(reply, Pong):
            return header(T_PONG, 0)
        if isinstance(reply, Unknown):
            return header(T_UNKN, 0)
        if isinstance(reply, Version):
            if self.handshake is None or self._sent_version:
                raise LocalProtocolError("VERS only answers a HELO, once", reason="unexpected_vers")
            self._sent_version = True
            body = reply.handshake.pack()
            return header(T_VERS, len(body)) + body
        raise LocalProtocolError(f"not a Courier server reply: {reply!r}", reason="bad_reply")

    # The state machine. Every path that can fail raises a RemoteProtocolError subclass;
    # _run records it so that later feeds fail the same way.
    def _run(self) -> Iterator[ServerEvent]:
        try:
            while True:
                state = self._state
                if state is _State.HEADER:
                    if len(self._buf) < HEADER.size:
                        return
                    ev = self._on_header()
                    if ev is not None:
                        yield ev
                elif state is _State.DATA:
                    progressed = yield from self._on_data()
                    if not progressed:
                        return
                elif state is _State.NONCE:
                    if len(self._buf) < NONCE_SIZE:
                        return
                    self._nonce = bytes(self._buf[:NONCE_SIZE])
                    del self._buf[:NONCE_SIZE]
                    # Courier sends RFC 1950 zlib; wbits 15 rejects anything else.
                    self._inflater = zlib.decompressobj()
                    self._plain = bytearray()
                    self._inflated = 0
                    self._index = 0
                    self._state = _State.DATA
                    yield PayloadStarted(self._nonce, self._kind)
                elif state is _State.HANDSHAKE:
                    if len(self._buf) < self._length:
                        return
                    body = bytes(self._buf[: self._length])
                    del self._buf[: self._length]
                    self.handshake = Handshake.unpack(body)
                    self._state = _State.HEADER
                    yield Hello(self.handshake)
                elif state is _State.SKIP:
                    n = min(self._skip, len(self._buf))
                    del self._buf[:n]
                    self._skip -= n
                    if self._skip:
                        return
                    self._state = _State.HEADER
                    if self._type != T_UNKN:
                        yield UnknownMessage(self._type, self._length)
                else:  # ERROR
                    raise self._error  # type: ignore[misc]
        except RemoteProtocolError as e:
            self._fail(e)
            raise
        except (zlib.error, struct.error, ValueError, MemoryError) as e:  # defensive: nothing else escapes
            err = CourierProtocolError(f"undecodable data: {e}", reason="undecodable")
            self._fail(err)
            raise err from None

    def _fail(self, e: RemoteProtocolError) -> None:
        self._error = e
        self._state = _State.ERROR
        self._buf = bytearray()
        self._plain = bytearray()
        self._inflater = None

    def _on_header(self) -> ServerEvent | None:
        type_, length = HEADER.unpack_from(self._buf)
        del self._buf[: HEADER.size]
        first = self.messages == 0
        self.messages += 1
        self._type, self._length = type_, length
        if type_ == T_JDAT:
            if length > self.max_message:
                raise FrameTooLarge(f"JDAT of {length} bytes exceeds the {self.max_message}-byte limit")
            if length < NONCE_SIZE:
                raise CourierProtocolError(f"JDAT of {length} bytes has no room for its nonce", reason="short_jdat")
            self._kind, self._remaining, self._state = "JDAT", length - NONCE_SIZE, _State.NONCE
            return None
        if type_ == T_EVNT:
            if length != STREAM_LENGTH:
                raise CourierProtocolError(f"EVNT length must be 0xFFFFFFFF, got {length}", reason="bad_evnt_length")
            self._kind, self._remaining, self._state = "EVNT", None, _State.NONCE
            return None
        if type_ == T_PING:
            if length != 0:
                raise CourierProtocolError(f"PING with a {length}-byte body", reason="ping_with_body")
            return Ping()
        if type_ == T_HELO:
            if not first:
                raise CourierProtocolError("HELO after the first message", reason="late_helo")
            if length > HANDSHAKE_MAX:
                raise CourierProtocolError(f"HELO of {length} bytes, at most 32", reason="bad_handshake")
            self._state = _State.HANDSHAKE
            return None
        # Unknown (including server-only types a client must not send): skip the body
        # without buffering it. A length beyond the limit means framing is lost.
        if length > self.max_message:
            raise FrameTooLarge(f"{type_!r} message of {length} bytes exceeds the {self.max_message}-byte limit")
        self._skip = length
        self._state = _State.SKIP
        return None

    def _on_data(self) -> Iterator[ServerEvent]:
        """Inflate what is buffered, one bounded step at a time; returns whether it progressed."""
        d = self._inflater
        if self._remaining is None:
            chunk = bytes(self._buf)
        else:
            chunk = bytes(self._buf[: self._remaining])
        if not chunk:
            if self._remaining == 0:
                raise CompressionError("JDAT zlib data is truncated")
            return False
        consumed_before = len(chunk)
        while True:
            try:
                out = d.decompress(chunk, INFLATE_STEP)
            except zlib.error as e:
                raise CompressionError(f"{self._kind} payload does not inflate: {e}") from None
            self._inflated += len(out)
            self.inflated_total += len(out)
            if self._inflated > self.max_decompressed:
                raise DecompressedTooLarge(
                    f"{self._kind} payload inflates beyond the {self.max_decompressed}-byte limit"
                )
            if out:
                self._plain += out
                yield from self._records()
            chunk = d.unconsumed_tail
            if d.eof or not chunk:
                break
        # Account for compressed input consumed: everything but what zlib left unused.
        unused = len(d.unused_data) if d.eof else 0
        used = consumed_before - unused
        del self._buf[:used]
        if self._remaining is not None:
            self._remaining -= used
        if d.eof:
            if self._remaining:
                raise CourierProtocolError(
                    f"JDAT has {self._remaining} bytes after the end of its zlib data", reason="jdat_trailing"
                )
            if self._plain:
                raise CourierProtocolError(
                    f"{self._kind} payload ends inside a record ({len(self._plain)} bytes left)", reason="truncated_record"
                )
            count, nonce = self._index, self._nonce
            self._inflater = None
            self._state = _State.HEADER
            yield PayloadEnded(nonce, count)
            return True
        if self._remaining == 0:
            raise CompressionError("JDAT zlib data is truncated")
        return False

    def _records(self) -> Iterator[EventReceived]:
        plain = self._plain
        pos, end = 0, len(plain)
        nonce = self._nonce
        # Bound once: CPython compiles a method call on an imported name (U32) as an attribute
        # load and a call, which would make a bound method for every record.
        unpack_from = U32.unpack_from
        try:
            while end - pos >= 4:
                (n,) = unpack_from(plain, pos)
                if n > self.max_event:
                    raise FrameTooLarge(f"event of {n} bytes exceeds the {self.max_event}-byte limit")
                if end - pos - 4 < n:
                    break
                if self._index >= self.max_events:
                    raise CourierProtocolError(f"{self._kind} payload holds more than {self.max_events} events",
                                               reason="too_many_events")
                raw = bytes(plain[pos + 4 : pos + 4 + n])
                pos += 4 + n
                index = self._index
                self._index = index + 1
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    obj = None
                if obj.__class__ is dict:
                    yield EventReceived(nonce, index, obj, raw)
                else:
                    yield EventReceived(nonce, index, event_body(raw))
        finally:
            del plain[:pos]


# ------------------------------------------------------------------ client half

class CourierClient:
    """The client side: encodes requests, decodes the server's replies."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._error: RemoteProtocolError | None = None

    def hello(self, handshake: Handshake | None = None) -> bytes:
        body = (handshake or Handshake(b"\0\0\0\0", *VERSION, CLIENT_ID)).pack()
        return header(T_HELO, len(body)) + body

    def ping(self) -> bytes:
        return header(T_PING, 0)

    def jdat(self, nonce: bytes, events: Sequence[bytes]) -> bytes:
        return encode_jdat(nonce, events)

    def evnt(self, nonce: bytes, events: Sequence[bytes]) -> bytes:
        return encode_evnt(nonce, events)

    def feed(self, data: bytes) -> list[ClientEvent]:
        if self._error is not None:
            raise self._error
        self._buf += data
        out: list[ClientEvent] = []
        try:
            while len(self._buf) >= HEADER.size:
                type_, length = HEADER.unpack_from(self._buf)
                if type_ == T_ACKN:
                    if length != ACKN_BODY.size:
                        raise CourierProtocolError(f"ACKN of {length} bytes, must be 20", reason="bad_ackn")
                elif type_ == T_VERS:
                    if length > HANDSHAKE_MAX:
                        raise CourierProtocolError(f"VERS of {length} bytes, at most 32", reason="bad_handshake")
                elif type_ in (T_PONG, T_UNKN):
                    if length != 0:
                        raise CourierProtocolError(f"{type_.decode()} with a body", reason="bad_length")
                else:
                    raise CourierProtocolError(f"unexpected server message {type_!r}", reason="unexpected_message")
                if len(self._buf) < HEADER.size + length:
                    break
                body = bytes(self._buf[HEADER.size : HEADER.size + length])
                del self._buf[: HEADER.size + length]
                if type_ == T_ACKN:
                    nonce, seq = ACKN_BODY.unpack(body)
                    out.append(AckReceived(nonce, seq))
                elif type_ == T_VERS:
                    out.append(VersionReceived(Handshake.unpack(body)))
                elif type_ == T_PONG:
                    out.append(PongReceived())
                else:
                    out.append(UnknownReceived())
        except RemoteProtocolError as e:
            self._error = e
            if not out:
                raise
        return out
