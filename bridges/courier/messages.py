"""What the Courier engine pair hands over and takes: the server's events and replies, the client's events.

`CourierServer.feed()` returns `ServerEvent`s and `CourierServer.send()` takes a
`ServerReply`; `CourierClient.feed()` returns `ClientEvent`s (bridges/courier/engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from bridges.courier.wire import CLIENT_ID, FLAG_EVNT, VERSION, Handshake


# --------------------------------------------------------------------------- events

@dataclass(frozen=True, slots=True)
class Hello:
    """A client opened with HELO; answer with `Version()`."""

    handshake: Handshake


@dataclass(frozen=True, slots=True)
class Ping:
    """Answer with `Pong()`."""


@dataclass(frozen=True, slots=True)
class UnknownMessage:
    """A message type this engine does not know (its body was skipped); answer `Unknown()`."""

    type: bytes
    length: int


@dataclass(frozen=True, slots=True)
class PayloadStarted:
    """A JDAT or EVNT payload began; its events follow."""

    nonce: bytes
    kind: str  # "JDAT" or "EVNT"


@dataclass(frozen=True, slots=True)
class EventReceived:
    """One event of a payload. `index` counts from 0 within the payload."""

    nonce: bytes
    index: int
    body: dict[str, Any] = field(hash=False, compare=True)
    # The event's JSON text when `body` is exactly that object (lets the bridge splice, not re-encode).
    raw: bytes | None = field(default=None, hash=False, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class PayloadEnded:
    """Every event of the payload was delivered; `count` of them."""

    nonce: bytes
    count: int


ServerEvent = Union[Hello, Ping, UnknownMessage, PayloadStarted, EventReceived, PayloadEnded]


# ---------------------------------------------------------------- replies (server)

@dataclass(frozen=True, slots=True)
class Version:
    """VERS: the handshake answer. By default it announces EVNT support."""

    handshake: Handshake = Handshake(bytes([FLAG_EVNT, 0, 0, 0]), *VERSION, CLIENT_ID)


@dataclass(frozen=True, slots=True)
class Pong:
    pass


@dataclass(frozen=True, slots=True)
class Ack:
    """ACKN: `sequence` events of payload `nonce` are processed."""

    nonce: bytes
    sequence: int


@dataclass(frozen=True, slots=True)
class Unknown:
    """`????`: the answer to a message type we do not implement."""


ServerReply = Union[Version, Pong, Ack, Unknown]


# ------------------------------------------------------------ events (client half)

@dataclass(frozen=True, slots=True)
class VersionReceived:
    handshake: Handshake


@dataclass(frozen=True, slots=True)
class PongReceived:
    pass


@dataclass(frozen=True, slots=True)
class AckReceived:
    nonce: bytes
    sequence: int


@dataclass(frozen=True, slots=True)
class UnknownReceived:
    """The server answered `????` to something we sent."""


ClientEvent = Union[VersionReceived, PongReceived, AckReceived, UnknownReceived]
