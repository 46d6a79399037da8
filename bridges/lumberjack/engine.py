"""Sans-IO Lumberjack v1/v2 (Beats) engine: a server half and a client half, no sockets.

Server: `LumberjackServer.feed(bytes)` returns `WindowFrame`, `DataFrame` (v1 'D',
a string map) and `JsonFrames` events; `send(Ack | Keepalive)` returns the 6-byte ack to
write, in the connection's own version byte (the npm v1 client drops the connection on
a '2'). `JsonFrames` is a run of back-to-back v2 'J' frames (raw JSON bytes) as one
event: a Beats window is thousands of them in one C frame, and one Python object per
event cost more than the rest of the bridge; `JsonFrames.texts()` gives their documents.

Client: `LumberjackClient.send(events)` returns the bytes of one window (W, then the data
frames, optionally inside a C frame); `feed(bytes)` returns the `AckFrame`s received.

Every length field is checked against a limit before anything is allocated or inflated,
and inflating a C frame is bounded. Bad input raises a `RemoteProtocolError` subclass and
nothing else; after one the server refuses further input.

Window bookkeeping: each W frame opens a new window (numbered from 1; events that arrive
before any W belong to window 0). Acks are cumulative per window, so a keepalive must
never repeat a seq acked in an *earlier* window: to a client that restarts at 1 for every
window (Filebeat, npm lumberjack-client), that would acknowledge events it has not yet
had acknowledged.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from dataclasses import dataclass
from typing import Iterable, Mapping, Union

import orjson

from bridges.lumberjack.scan import scanner
from logjam.errors import (
    DecompressedTooLarge,
    FrameTooLarge,
    HeldErrors,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)

V1 = 0x31  # b"1"
V2 = 0x32  # b"2"
VERSIONS = (V1, V2)

T_WINDOW = 0x57  # W
T_DATA = 0x44  # D
T_JSON = 0x4A  # J
T_COMPRESSED = 0x43  # C
T_ACK = 0x41  # A

SEQ_MAX = 2**32 - 1
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024
# Real clients put only W/D/J inside a C; one extra level is tolerated, deeper is hostile.
MAX_NESTING = 2
# C payloads inflate in steps of this many bytes: a payload that is not Lumberjack (a bomb
# of zeros) is refused after the first step, and one over the limit is refused before
# the steps are joined, so it never costs twice the limit.
INFLATE_STEP = 1024 * 1024
_INNER_TYPES = (0x57, 0x44, 0x4A, 0x43)  # W D J C

_U32 = struct.Struct(">I")
_HDR_U32 = struct.Struct(">BBI")
_HDR_U32_U32 = struct.Struct(">BBII")


class LumberjackError(RemoteProtocolError):
    """The peer sent something that is not Lumberjack."""

    reason = "lumberjack_protocol"


class UnknownVersion(LumberjackError):
    reason = "bad_version"


class UnknownFrameType(LumberjackError):
    reason = "unknown_frame_type"


class TruncatedCompressedFrame(LumberjackError):
    """A C payload ended in the middle of a frame (the spec requires whole frames)."""

    reason = "truncated_compressed_frame"


class NestingTooDeep(LumberjackError):
    reason = "compressed_nesting"


# ---------------------------------------------------------------- events and replies


@dataclass(frozen=True, slots=True)
class WindowFrame:
    """`V W size`: the client will send up to `size` events before waiting for an ack."""

    version: int
    size: int
    window: int


@dataclass(frozen=True, slots=True)
class DataFrame:
    """v1 `D`: a map of UTF-8 strings (keys and values that are not UTF-8 are kept as bytes)."""

    version: int
    seq: int
    window: int
    fields: dict[str, str | bytes]


@dataclass(frozen=True, slots=True)
class JsonFrames:
    """v2 `J` frames that arrived back to back in one window, in one version.

    Frame i has sequence number `seqs[i]` and its JSON document is
    `data[offsets[i] : offsets[i] + lengths[i]]`: the documents stay in the buffer they
    were read or inflated into, and nothing is made per frame.
    """

    version: int
    window: int
    seqs: array
    data: bytes
    offsets: array
    lengths: array

    def __len__(self) -> int:
        return len(self.seqs)

    def payload(self, i: int) -> bytes:
        start = self.offsets[i]
        return self.data[start : start + self.lengths[i]]

    def texts(self) -> list[memoryview]:
        """Every frame's JSON document as a view of `data`, for the mapper (nothing is copied)."""
        view = memoryview(self.data)
        return [view[o : o + n] for o, n in zip(self.offsets, self.lengths)]

    def split(self, n: int) -> tuple["JsonFrames", "JsonFrames"]:
        """The first n frames, and the rest (sharing `data`)."""
        head = JsonFrames(self.version, self.window, self.seqs[:n], self.data, self.offsets[:n], self.lengths[:n])
        tail = JsonFrames(self.version, self.window, self.seqs[n:], self.data, self.offsets[n:], self.lengths[n:])
        return head, tail


Event = Union[WindowFrame, DataFrame, JsonFrames]


@dataclass(frozen=True, slots=True)
class Ack:
    """Acknowledge every event up to and including `seq` of window `window`."""

    seq: int
    window: int


@dataclass(frozen=True, slots=True)
class Keepalive:
    """Tell a waiting client we are alive while events of `window` are still unacked."""

    window: int


@dataclass(frozen=True, slots=True)
class AckFrame:
    """An ack as the client sees it."""

    version: int
    seq: int


# ---------------------------------------------------------------- server


class _PairsState:
    """A v1 D frame whose pairs have not all arrived yet (so byte-by-byte input stays linear)."""

    __slots__ = ("version", "seq", "left", "fields", "size")

    def __init__(self, version: int, seq: int, left: int) -> None:
        self.version = version
        self.seq = seq
        self.left = left
        self.fields: dict[str, str | bytes] = {}
        self.size = 10


def _text(raw: bytes) -> str | bytes:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw


class LumberjackServer(HeldErrors):
    """The receiving side of one Lumberjack connection."""

    def __init__(
        self,
        max_frame_size: int = DEFAULT_MAX_FRAME,
        max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED,
        native: bool = True,
    ) -> None:
        # Runs address their frames with 32-bit offsets into one buffer.
        if not 0 < max_decompressed_size <= SEQ_MAX or not 0 < max_frame_size <= SEQ_MAX:
            raise LocalProtocolError("frame and decompressed size limits must be between 1 and 2^32-1 bytes")
        self._scan = scanner(native)
        self.max_frame_size = max_frame_size
        self.max_decompressed_size = max_decompressed_size
        self.version = V2
        self.window = 0
        self.last_ack_seq = 0
        self.last_ack_window = -1
        self._buf = bytearray()
        self._pairs: _PairsState | None = None
        self._error: ProtocolError | None = None
        self.inflated_total = 0  # bytes C frames inflated to, over the connection's life

    # -- input

    @property
    def mid_frame(self) -> bool:
        """Part of a frame has arrived, not all of it (the host's --frame-timeout runs)."""
        return bool(self._buf) or bool(self._pairs and self._pairs.size)

    def feed(self, data: bytes) -> list[Event]:
        """Consume bytes from the peer; return the complete events they finish."""
        self._raise_held()
        out: list[Event] = []
        try:
            if data:
                self._buf += data
            buf = self._buf
            pos = 0
            if self._pairs is not None:
                pos = self._continue_pairs(buf, pos, len(buf), out)
            if self._pairs is None:
                pos = self._parse(buf, pos, len(buf), 0, out, outer=True, budget=self.max_decompressed_size)
            if pos:
                del buf[:pos]
        except RemoteProtocolError as e:
            # A compressed frame is all or nothing: none of this call's events are given.
            # `_hold` drops the traceback, which holds the frames that held the inflated
            # payload (up to the limit): else the held error keeps that memory until the
            # cycle collector runs, which the bridge has told to run rarely.
            self._buf = bytearray()
            self._pairs = None
            self._hold([], e)
        return out

    def _version(self, v: int, outer: bool) -> None:
        if v not in VERSIONS:
            raise UnknownVersion(f"unknown Lumberjack version byte 0x{v:02x}")
        if outer:
            self.version = v

    def _parse(
        self, buf: bytes | bytearray, pos: int, end: int, depth: int, out: list[Event], outer: bool, budget: int
    ) -> int:
        """Parse whole frames in buf[pos:end]; return where parsing stopped.

        In the outer stream an incomplete frame waits for more input; inside a C payload it
        is an error, because the payload must hold whole frames. `budget` is what C frames
        found here may inflate to: each top-level C gets the full limit, and C frames nested
        inside it share what their parent left.
        """
        max_frame = self.max_frame_size
        while pos < end:
            avail = end - pos
            if avail < 2:
                break
            version = buf[pos]
            ftype = buf[pos + 1]
            self._version(version, outer)
            if ftype == T_JSON:
                if avail < 10:
                    break
                _, _, seq, length = _HDR_U32_U32.unpack_from(buf, pos)
                if length > max_frame:
                    raise FrameTooLarge(f"J frame of {length} bytes exceeds the limit of {max_frame}")
                if avail < 10 + length:
                    break
                pos = self._json_run(buf, pos, end, version, out)
            elif ftype == T_WINDOW:
                if avail < 6:
                    break
                _, _, size = _HDR_U32.unpack_from(buf, pos)
                self.window += 1
                out.append(WindowFrame(version, size, self.window))
                pos += 6
            elif ftype == T_COMPRESSED:
                if avail < 6:
                    break
                _, _, length = _HDR_U32.unpack_from(buf, pos)
                if length > max_frame:
                    raise FrameTooLarge(f"C frame of {length} bytes exceeds the limit of {max_frame}")
                if avail < 6 + length:
                    break
                if depth + 1 > MAX_NESTING:
                    raise NestingTooDeep(f"C frames nested more than {MAX_NESTING} deep")
                with memoryview(buf) as whole, whole[pos + 6 : pos + 6 + length] as compressed:
                    inner = self._inflate(compressed, budget)
                pos += 6 + length
                left = budget - len(inner)
                if not outer:
                    budget = left  # siblings inside one C share its limit
                self._parse(inner, 0, len(inner), depth + 1, out, outer=False, budget=left)
            elif ftype == T_DATA:
                if avail < 10:
                    break
                _, _, seq, npairs = _HDR_U32_U32.unpack_from(buf, pos)
                if 10 + 8 * npairs > max_frame:
                    raise FrameTooLarge(f"D frame with {npairs} pairs exceeds the limit of {max_frame} bytes")
                st = _PairsState(version, seq, npairs)
                pos = self._pairs_from(buf, pos + 10, end, st)
                if st.left:
                    if not outer:
                        raise TruncatedCompressedFrame("C payload ends inside a D frame")
                    self._pairs = st
                    return pos
                out.append(DataFrame(version, seq, self.window, st.fields))
            else:
                raise UnknownFrameType(f"unknown Lumberjack frame type 0x{ftype:02x}")
        if pos < end and not outer:
            raise TruncatedCompressedFrame("C payload ends inside a frame")
        return pos

    def _json_run(self, buf: bytes | bytearray, pos: int, end: int, version: int, out: list[Event]) -> int:
        """The run of whole J frames starting at pos (there is at least one) as one event."""
        seqs, offs, lens = array("I"), array("I"), array("I")
        # An inflated C payload is kept by the run as it is; the connection's own buffer is
        # reused, so from there the run takes a copy of its span.
        base = 0 if buf.__class__ is bytes else pos
        run_end = self._scan(buf, pos, end, base, version, self.max_frame_size, seqs, offs, lens)
        data = buf if buf.__class__ is bytes else bytes(buf[pos:run_end])
        out.append(JsonFrames(version, self.window, seqs, data, offs, lens))
        return run_end

    def _continue_pairs(self, buf: bytearray, pos: int, end: int, out: list[Event]) -> int:
        st = self._pairs
        assert st is not None
        pos = self._pairs_from(buf, pos, end, st)
        if not st.left:
            self._pairs = None
            out.append(DataFrame(st.version, st.seq, self.window, st.fields))
        return pos

    def _pairs_from(self, buf: bytes | bytearray, pos: int, end: int, st: _PairsState) -> int:
        max_frame = self.max_frame_size
        unpack = _U32.unpack_from
        fields = st.fields
        while st.left:
            if end - pos < 4:
                break
            (klen,) = unpack(buf, pos)
            if st.size + 8 + klen > max_frame:
                raise FrameTooLarge(f"D frame exceeds the limit of {max_frame} bytes")
            if end - pos < 8 + klen:
                break
            (vlen,) = unpack(buf, pos + 4 + klen)
            if st.size + 8 + klen + vlen > max_frame:
                raise FrameTooLarge(f"D frame exceeds the limit of {max_frame} bytes")
            if end - pos < 8 + klen + vlen:
                break
            key = _text(bytes(buf[pos + 4 : pos + 4 + klen]))
            value = _text(bytes(buf[pos + 8 + klen : pos + 8 + klen + vlen]))
            # A key that is not UTF-8 cannot be a JSON key; keep it visible, escaped.
            fields[key if isinstance(key, str) else key.decode("utf-8", "backslashreplace")] = value
            pos += 8 + klen + vlen
            st.size += 8 + klen + vlen
            st.left -= 1
        return pos

    def _inflate(self, data: memoryview, limit: int) -> bytes:
        d = zlib.decompressobj()
        chunks: list[bytes] = []
        total = 0
        tail: bytes | memoryview = data
        try:
            while not d.eof:
                out = d.decompress(tail, min(INFLATE_STEP, limit + 1 - total))
                tail = d.unconsumed_tail
                if out:
                    if not chunks and (out[0] not in VERSIONS or (len(out) > 1 and out[1] not in _INNER_TYPES)):
                        raise LumberjackError("C frame does not inflate to Lumberjack frames", reason="bad_compressed_payload")
                    chunks.append(out)
                    total += len(out)
                    if total > limit:
                        chunks.clear()
                        raise DecompressedTooLarge(f"C frame inflates past the limit of {limit} bytes")
                elif not tail:
                    break  # no input left and nothing more comes out: truncated
        except zlib.error as e:
            raise LumberjackError(f"C frame is not valid zlib: {e}", reason="bad_zlib") from None
        if not d.eof:
            raise LumberjackError("C frame holds a truncated zlib stream", reason="bad_zlib")
        if d.unused_data:
            raise LumberjackError("C frame has bytes after its zlib stream", reason="bad_zlib")
        self.inflated_total += total
        if len(chunks) == 1:
            return chunks[0]
        inner = b"".join(chunks)
        chunks.clear()
        return inner

    # -- output

    def send(self, reply: Ack | Keepalive) -> bytes:
        """The 6-byte ack for `reply`; write it with one write call."""
        if isinstance(reply, Ack):
            if not 0 <= reply.seq <= SEQ_MAX:
                raise LocalProtocolError(f"ack seq {reply.seq} is not a u32")
            self.last_ack_seq = reply.seq
            self.last_ack_window = reply.window
            seq = reply.seq
        elif isinstance(reply, Keepalive):
            seq = self.last_ack_seq if reply.window == self.last_ack_window else 0
        else:
            raise LocalProtocolError(f"cannot send {reply!r}")
        return _HDR_U32.pack(self.version, T_ACK, seq)


# ---------------------------------------------------------------- client


def encode_json_frame(seq: int, payload: bytes, version: int = V2) -> bytes:
    return _HDR_U32_U32.pack(version, T_JSON, seq, len(payload)) + payload


def encode_data_frame(seq: int, fields: Mapping[str, str | bytes], version: int = V1) -> bytes:
    parts = [_HDR_U32_U32.pack(version, T_DATA, seq, len(fields))]
    for k, v in fields.items():
        kb = k.encode()
        vb = v if isinstance(v, bytes) else str(v).encode()
        parts += (_U32.pack(len(kb)), kb, _U32.pack(len(vb)), vb)
    return b"".join(parts)


def encode_window(size: int, version: int = V2) -> bytes:
    return _HDR_U32.pack(version, T_WINDOW, size)


def encode_compressed(frames: bytes, version: int = V2, level: int = 6) -> bytes:
    body = zlib.compress(frames, level)
    return _HDR_U32.pack(version, T_COMPRESSED, len(body)) + body


class LumberjackClient:
    """The sending side: builds windows, reads acks. Used by tests, benchmarks and logjam-send.

    `first_seq` and `restart_each_window` reproduce the numbering schemes of real clients:
    counting across windows from 1 (pylogbeat), restarting at 1 (Filebeat), or from 0.
    """

    def __init__(
        self,
        version: int = V2,
        compress_level: int | None = 6,
        first_seq: int = 1,
        restart_each_window: bool = False,
        window_inside_compressed: bool = False,
    ) -> None:
        if version not in VERSIONS:
            raise LocalProtocolError(f"unknown version {version}")
        self.version = version
        self.compress_level = compress_level
        self.first_seq = first_seq
        self.restart_each_window = restart_each_window
        self.window_inside_compressed = window_inside_compressed
        self.next_seq = first_seq
        self.last_seq: int | None = None
        self._buf = bytearray()

    def _frame(self, event: Mapping[str, object] | bytes) -> bytes:
        seq = self.next_seq
        self.last_seq = seq
        self.next_seq = 0 if seq >= SEQ_MAX else seq + 1
        if self.version == V1:
            if isinstance(event, bytes):
                raise LocalProtocolError("v1 events are string maps")
            return encode_data_frame(seq, {str(k): v if isinstance(v, bytes) else str(v) for k, v in event.items()}, V1)
        payload = event if isinstance(event, bytes) else orjson.dumps(event)
        return encode_json_frame(seq, payload, V2)

    def send(self, events: Iterable[Mapping[str, object] | bytes]) -> bytes:
        """One window: returns the bytes to write. `last_seq` is the ack that completes it."""
        if self.restart_each_window:
            self.next_seq = self.first_seq
        frames = [self._frame(e) for e in events]
        window = encode_window(len(frames), self.version)
        data = b"".join(frames)
        if self.compress_level is None:
            return window + data
        if self.window_inside_compressed:
            return encode_compressed(window + data, self.version, self.compress_level)
        return window + encode_compressed(data, self.version, self.compress_level)

    def feed(self, data: bytes) -> list[AckFrame]:
        """Parse acks from the server."""
        self._buf += data
        out: list[AckFrame] = []
        pos = 0
        buf = self._buf
        while len(buf) - pos >= 6:
            version, ftype, seq = _HDR_U32.unpack_from(buf, pos)
            if version not in VERSIONS:
                raise UnknownVersion(f"unknown Lumberjack version byte 0x{version:02x}")
            if ftype != T_ACK:
                raise UnknownFrameType(f"server sent frame type 0x{ftype:02x}, expected an ack")
            out.append(AckFrame(version, seq))
            pos += 6
        del buf[:pos]
        return out
