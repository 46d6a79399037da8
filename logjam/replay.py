"""The replay protocol: ask a device for journaled messages by sequence range.

A DEALER sends `["replay", from u64, to u64]` to the device's replay ROUTER (9607).
The answer is one of:

- `["batch", next u64, app-env, topic, body, meta, ...]`: messages from `from` on
  (at most a chunk; ask again from `next` for more);
- `["gone", first u64]`: `from` is older than retention; the journal starts at `first`;
- `["end", last u64]`: nothing at or after `from` yet (`last` is the newest seq).

Each request gets exactly one reply, so the client controls the flow.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import zmq

from logjam import lifecycle
from logjam.errors import RemoteProtocolError
from logjam.message import Message

REPLAY = b"replay"
BATCH = b"batch"
GONE = b"gone"
END = b"end"
_U64 = struct.Struct(">Q")


def u64(n: int) -> bytes:
    return _U64.pack(n)


def read_u64(frame: bytes) -> int:
    if len(frame) != 8:
        raise RemoteProtocolError(f"expected an 8-byte number, got {len(frame)} bytes", reason="bad_replay")
    return _U64.unpack(frame)[0]


@dataclass(frozen=True, slots=True)
class Lost:
    """Sequence numbers `first`..`last` are gone from the journal (retention): a real loss."""

    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


class ReplayTimeout(TimeoutError):
    """The replay endpoint did not answer in time."""


class ReplayClient:
    def __init__(self, endpoint: str, *, context: zmq.Context | None = None, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket | None = None

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            self._sock = lifecycle.socket(self._ctx, zmq.DEALER, linger_ms=0)
            self._sock.connect(self.endpoint)
        return self._sock

    def _ask(self, from_seq: int, to_seq: int) -> list[bytes]:
        sock = self._socket()
        sock.send_multipart([REPLAY, u64(from_seq), u64(to_seq)])
        if not sock.poll(int(self.timeout * 1000)):
            # A late answer would pair with the next question: start over on a new socket.
            sock.close()
            self._sock = None
            raise ReplayTimeout(f"no replay answer from {self.endpoint} within {self.timeout}s")
        return sock.recv_multipart()

    def fetch(self, from_seq: int, to_seq: int) -> Iterator[Message | Lost]:
        """Everything in `from_seq`..`to_seq` that the journal still has, plus a Lost for what it has not."""
        seq = from_seq
        while seq <= to_seq:
            frames = self._ask(seq, to_seq)
            kind = frames[0] if frames else b""
            if kind == GONE:
                first = read_u64(frames[1])
                yield Lost(seq, min(first - 1, to_seq))
                seq = first
            elif kind == END:
                return
            elif kind == BATCH:
                nxt = read_u64(frames[1])
                body = frames[2:]
                if len(body) % 4 or nxt <= seq:
                    raise RemoteProtocolError("malformed replay batch", reason="bad_replay")
                for i in range(0, len(body), 4):
                    msg = Message.from_frames(body[i : i + 4])
                    if msg.meta.seq > to_seq:
                        return
                    yield msg
                seq = nxt
            else:
                raise RemoteProtocolError(f"unknown replay answer {kind[:16]!r}", reason="bad_replay")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
