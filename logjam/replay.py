"""The replay protocol: ask a device for journaled messages by sequence range.

A device's sequence numbers are only meaningful together with its **journal id**
(16 lowercase hex digits): a journal gets one when it is created, so a device
whose journal was wiped or replaced numbers from 1 again under a new id. Every
answer names the journal it comes from.

A DEALER sends one of these to the device's replay ROUTER (9607):

- `["info"]`, answered `["info", journal_id, first u64, last u64]`: the journal
  holds `first`..`last` (an empty journal, or a device without one: `first = last + 1`,
  with `last` the newest sequence number it used);
- `["replay", from u64, to u64]`, answered with one of
  - `["batch", journal_id, next u64, app-env, topic, body, meta, ...]`: messages from
    `from` on (at most a chunk; ask again from `next` for more);
  - `["gone", journal_id, first u64]`: `from` is older than retention; the journal
    starts at `first`;
  - `["end", journal_id, last u64]`: nothing at or after `from` yet (`last` is the
    newest seq).

- `["progress", journal_id, seq u64, importer name]`, never answered: an importer's
  report that everything of that journal up to `seq` is committed (the device's flow
  control waits for importers that fall behind, devices/lag.py).

A device without a journal answers `info` only; a `replay` gets no answer from it.
Each request gets at most one reply, so the client controls the flow.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Iterator

import zmq

from logjam import sockets
from logjam.curve import ClientKey, connect
from logjam.errors import RemoteProtocolError
from logjam.message import Message

REPLAY = b"replay"
INFO = b"info"
BATCH = b"batch"
GONE = b"gone"
END = b"end"
PROGRESS = b"progress"
_U64 = struct.Struct(">Q")
_JOURNAL_ID = re.compile(rb"[0-9a-f]{16}")


def u64(n: int) -> bytes:
    return _U64.pack(n)


def read_u64(frame: bytes) -> int:
    if len(frame) != 8:
        raise RemoteProtocolError(f"expected an 8-byte number, got {len(frame)} bytes", reason="bad_replay")
    return _U64.unpack(frame)[0]


def read_journal_id(frame: bytes) -> str:
    if not _JOURNAL_ID.fullmatch(frame):
        raise RemoteProtocolError(f"expected a journal id (16 hex digits), got {bytes(frame[:32])!r}", reason="bad_replay")
    return frame.decode("ascii")


@dataclass(frozen=True, slots=True)
class Lost:
    """Sequence numbers `first`..`last` are gone from the journal (retention): a real loss."""

    first: int
    last: int

    @property
    def count(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True, slots=True)
class JournalInfo:
    """What a device's journal holds: `first`..`last` of journal `journal_id` (empty when first > last)."""

    journal_id: str
    first: int
    last: int


class JournalChanged(RemoteProtocolError):
    """The endpoint serves another journal than the one asked for: its numbers are not ours.

    The device's journal was wiped or replaced (or another device answers on that
    address). `first` is the oldest sequence number the new journal `actual` holds.
    A RemoteProtocolError, so that code which does not look for it treats it as a
    failed replay rather than reading the new journal's numbers as the old one's.
    """

    reason = "journal_changed"

    def __init__(self, expected: str, actual: str, first: int) -> None:
        super().__init__(f"the replay endpoint serves journal {actual} (from seq {first}), not {expected}")
        self.expected = expected
        self.actual = actual
        self.first = first


class ReplayTimeout(TimeoutError):
    """The replay endpoint did not answer in time."""


class ReplayClient:
    def __init__(self, endpoint: str, *, context: zmq.Context | None = None, timeout: float = 10.0,
                 curve: ClientKey | None = None) -> None:
        self.endpoint = endpoint
        self.curve = curve
        self.timeout = timeout
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket | None = None

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            self._sock = connect(sockets.socket(self._ctx, zmq.DEALER, linger_ms=0), self.endpoint, self.curve)
        return self._sock

    def _ask(self, request: list[bytes]) -> list[bytes]:
        sock = self._socket()
        sock.send_multipart(request)
        if not sock.poll(int(self.timeout * 1000)):
            # A late answer would pair with the next question: start over on a new socket.
            sock.close()
            self._sock = None
            raise ReplayTimeout(f"no replay answer from {self.endpoint} within {self.timeout}s")
        return sock.recv_multipart()

    def progress(self, journal: str, seq: int, name: str) -> None:
        """Report that everything of `journal` up to `seq` is committed; no answer comes back."""
        self._socket().send_multipart([PROGRESS, journal.encode("ascii"), u64(seq), name.encode()[:128]],
                                      flags=zmq.NOBLOCK)

    def info(self) -> JournalInfo:
        """The endpoint's journal id and the range its journal holds."""
        frames = self._ask([INFO])
        if len(frames) != 4 or frames[0] != INFO:
            raise RemoteProtocolError(f"malformed info answer ({len(frames)} frames)", reason="bad_replay")
        return JournalInfo(read_journal_id(frames[1]), read_u64(frames[2]), read_u64(frames[3]))

    def fetch(self, from_seq: int, to_seq: int, journal: str | None = None) -> Iterator[Message | Lost]:
        """Everything in `from_seq`..`to_seq` that the journal still has, plus a Lost for what it has not.

        With `journal`, every answer must come from that journal: otherwise JournalChanged
        is raised before anything of the other journal is yielded.
        """
        seq = from_seq
        while seq <= to_seq:
            frames = self._ask([REPLAY, u64(seq), u64(to_seq)])
            kind = frames[0] if frames else b""
            if kind not in (GONE, END, BATCH):
                raise RemoteProtocolError(f"unknown replay answer {kind[:16]!r}", reason="bad_replay")
            if len(frames) < 3 or (kind != BATCH and len(frames) != 3):
                raise RemoteProtocolError(f"malformed replay answer {kind!r} ({len(frames)} frames)", reason="bad_replay")
            actual = read_journal_id(frames[1])
            number = read_u64(frames[2])
            if journal is not None and actual != journal:
                raise self._changed(journal, actual, number if kind == GONE else None)
            if kind == GONE:
                yield Lost(seq, min(number - 1, to_seq))
                seq = number
            elif kind == END:
                return
            else:
                body = frames[3:]
                if len(body) % 4 or number <= seq:
                    raise RemoteProtocolError("malformed replay batch", reason="bad_replay")
                for i in range(0, len(body), 4):
                    msg = Message.from_frames(body[i : i + 4])
                    if msg.meta.seq > to_seq:
                        return
                    yield msg
                seq = number

    def _changed(self, expected: str, actual: str, first: int | None) -> JournalChanged:
        if first is None:
            # Only `gone` names the new journal's first seq; ask (it may have changed again).
            now = self.info()
            actual, first = now.journal_id, now.first
        return JournalChanged(expected, actual, first)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
