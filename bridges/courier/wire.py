"""The Log Courier wire format: message framing, the handshake body, limits, and payload encoding.

Wire format (the Log Courier protocol as real clients speak it, docs/protocols/courier.md):
every message is `[4 ASCII type bytes][u32 length][body]`, big-endian.

- HELO / VERS: a handshake body of up to 32 bytes (flags, major, minor, patch,
  client id, reserved). Clients send HELO first; old clients start with JDAT and get
  no VERS. The Ruby client sends 20-byte bodies, so any length up to 32 is accepted.
- JDAT: length = 16 + compressed size; a nonce, then zlib data holding
  `[u32 len][JSON event]` records.
- EVNT: length 0xFFFFFFFF; a nonce, then a zlib stream of the same records. The
  message ends where the zlib stream ends, so its size is not known up front.
- PING (length 0) -> PONG; ACKN (nonce + u32 count); `????` answers unknown types.

Both halves of the engine (bridges/courier/engine.py) frame with these; the payload
encoders are what a client sends, and what the tests and benchmarks build payloads with.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from logjam.errors import LocalProtocolError, RemoteProtocolError
from logjam.message import body_from_bytes

HEADER = struct.Struct(">4sI")
U32 = struct.Struct(">I")
ACKN_BODY = struct.Struct(">16sI")
HANDSHAKE = struct.Struct(">4sIII4s12x")  # 32 bytes

NONCE_SIZE = 16
HANDSHAKE_MAX = 32
STREAM_LENGTH = 0xFFFFFFFF
DEFAULT_MAX_MESSAGE = 10 * 1024 * 1024
DEFAULT_MAX_EVENT = 10 * 1024 * 1024
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024
# log-courier's default spool is 1024 events per payload; this leaves room for big spools.
DEFAULT_MAX_PAYLOAD_EVENTS = 16384

FLAG_EVNT = 0x01  # bit 0x01 of the first flags byte: "EVNT supported"

# Our own version and client id in VERS; clients only read the flags.
VERSION = (2, 10, 0)
CLIENT_ID = b"LJMS"

T_HELO, T_VERS, T_PING, T_PONG = b"HELO", b"VERS", b"PING", b"PONG"
T_JDAT, T_EVNT, T_ACKN, T_UNKN = b"JDAT", b"EVNT", b"ACKN", b"????"

UNMARSHAL_FAILURE = "_unmarshal_failure"


class CourierProtocolError(RemoteProtocolError):
    """The Courier peer sent something the protocol does not allow."""

    reason = "courier_protocol_error"


@dataclass(frozen=True, slots=True)
class Handshake:
    """The body of a HELO (from a client) or VERS (from a server)."""

    flags: bytes = b"\x00\x00\x00\x00"
    major: int = 0
    minor: int = 0
    patch: int = 0
    client: bytes = b"\x00\x00\x00\x00"

    @property
    def supports_evnt(self) -> bool:
        return bool(self.flags[0] & FLAG_EVNT)

    @classmethod
    def unpack(cls, body: bytes) -> "Handshake":
        if len(body) > HANDSHAKE_MAX:
            raise CourierProtocolError(f"handshake body of {len(body)} bytes, at most 32", reason="bad_handshake")
        flags, major, minor, patch, client = HANDSHAKE.unpack(bytes(body).ljust(HANDSHAKE_MAX, b"\0"))
        return cls(flags, major, minor, patch, client)

    def pack(self) -> bytes:
        return HANDSHAKE.pack(self.flags, self.major, self.minor, self.patch, self.client)

    def describe(self) -> str:
        name = self.client.rstrip(b"\0").decode("ascii", "replace") or "unknown"
        return f"{name} {self.major}.{self.minor}.{self.patch}"


def header(type_: bytes, length: int) -> bytes:
    return HEADER.pack(type_, length)


def check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_SIZE:
        raise LocalProtocolError(f"a nonce is 16 bytes, got {len(nonce)}", reason="bad_nonce")


def event_body(raw: bytes) -> dict[str, Any]:
    """Parse one record: a JSON object, or the unmarshal-failure wrapper Courier servers use."""
    return body_from_bytes(raw, (UNMARSHAL_FAILURE,))


def encode_records(events: Sequence[bytes]) -> bytes:
    return b"".join(U32.pack(len(e)) + e for e in events)


def encode_jdat(nonce: bytes, events: Sequence[bytes], level: int = 6) -> bytes:
    check_nonce(nonce)
    data = zlib.compress(encode_records(events), level)
    return header(T_JDAT, NONCE_SIZE + len(data)) + nonce + data


def encode_evnt(nonce: bytes, events: Sequence[bytes], level: int = 3) -> bytes:
    check_nonce(nonce)
    c = zlib.compressobj(level)
    parts = [header(T_EVNT, STREAM_LENGTH), nonce]
    for e in events:
        parts.append(c.compress(U32.pack(len(e)) + e))
    parts.append(c.flush())
    return b"".join(parts)
