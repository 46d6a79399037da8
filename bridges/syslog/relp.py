"""Sans-IO RELP (rsyslog's Reliable Event Logging Protocol): server and client halves.

A frame is `TXNR SP COMMAND SP DATALEN [SP DATA] LF` (librelp's doc/relp.md; docs/protocols/syslog.md).
The client opens with `open` (its offers), sends one syslog message per `syslog` frame and
ends with `close`; the server answers each with an `rsp` of the same TXNR, in the order the
commands came, `200 OK` or `500 <reason>`. librelp keeps up to 128 frames unanswered and
sends every unanswered one again after a reconnect, so an `rsp 200` is the only thing that
lets it forget a message: the bridge sends it after the device's 202 (at-least-once).

`RelpServer.feed` returns `Open`, `Syslogs` (the `syslog` frames of one read in a row, each
message with one trailing LF dropped, as in a counted frame) and `Close` events;
`send(Response(...))` is the bytes of one `rsp`, and `send_ok(txnrs)` those of `rsp 200 OK`
for a run of them; both refuse an answer out of order. Before `open` only `open` is
allowed, and nothing after `close`. DATALEN is checked against `max_frame` before anything
is buffered for it. `RelpClient` is the mirror image, for the tests and `logjam-send`.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bridges.syslog.engine import SyslogProtocolError
from logjam.errors import FrameTooLarge, HeldErrors, LocalProtocolError, RemoteProtocolError

DEFAULT_MAX_FRAME = 128 * 1024 + 64  # librelp's own bound on one frame's data, plus a header
MAX_TXNR = 999_999_999
TXNR_DIGITS = 9
COMMAND_MAX = 32
RELP_VERSION = "0"
SOFTWARE = "logjam-mesh"
# A `syslog` frame's header with data, both numbers without a leading zero (TXNR 0 is refused).
_SYSLOG_HEADER = re.compile(rb"([1-9][0-9]{0,8}) syslog ([1-9][0-9]{0,8}) ")
# Any header with data: DATALEN (group 1), and where the data begins.
_HEADER = re.compile(rb"[0-9]{1,9} [A-Za-z]{1,32} ([0-9]{1,9}) ")


# ---------------------------------------------------------------- events and replies

@dataclass(frozen=True, slots=True)
class Open:
    txnr: int
    offers: dict[str, str] = field(hash=False)


@dataclass(frozen=True, slots=True)
class Syslog:
    txnr: int
    raw: bytes


@dataclass(frozen=True, slots=True)
class Syslogs:
    """The `syslog` frames one `feed` completed in a row: their TXNRs and messages, in order.
    A run, not an object per frame, since the bridge maps a run in one call."""

    txnrs: list[int]
    raws: list[bytes]

    def frames(self) -> list[Syslog]:
        """The run as one `Syslog` per frame."""
        return [Syslog(txnr, raw) for txnr, raw in zip(self.txnrs, self.raws)]


@dataclass(frozen=True, slots=True)
class Close:
    txnr: int


@dataclass(frozen=True, slots=True)
class Response:
    """An `rsp`: a server's answer (`send`) or what a client received (`feed`)."""

    txnr: int
    code: int = 200
    text: str = "OK"
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class ServerClose:
    """The server's hint `0 serverclose 0`: it is going away."""


def _offers(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").split("\n"):
        name, _, value = line.partition("=")
        if name:
            out[name.strip()] = value.strip()
    return out


def open_answer() -> bytes:
    """The data of our `rsp` to `open`: librelp refuses a higher relp_version than its own 0."""
    return f"relp_version={RELP_VERSION}\nrelp_software={SOFTWARE}\ncommands=syslog".encode()


class _Framer:
    """Cuts `TXNR SP COMMAND SP DATALEN [SP DATA] LF` frames out of a stream."""

    __slots__ = ("max_frame", "buf", "need")

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.buf = bytearray()  # what is left of the last reads: the start of a frame
        # How long `buf` must be before that frame is whole (0: not known yet); until then a
        # read is only appended, so a frame trickling in costs no copies of what came before.
        self.need = 0

    def waiting(self) -> bool:
        """Whether the frame begun in `buf` is known to be still incomplete."""
        return len(self.buf) < self.need

    def keep(self, buf: bytes, pos: int) -> None:
        """Keep `buf[pos:]`, the start of a frame, for the next read, and note how long it must grow."""
        self.buf = bytearray(buf[pos:])
        m = _HEADER.match(buf, pos)
        self.need = m.end() - pos + int(m.group(1)) + 1 if m is not None else 0

    def frames(self) -> Iterator[tuple[int, str, bytes]]:
        """Every whole frame in the buffer; the buffer is cut once, after the last."""
        buf, pos = bytes(self.buf), 0
        try:
            while pos < len(buf):
                got = self.one(buf, pos)
                if got is None:
                    return
                pos = got[3]
                yield got[0], got[1], got[2]
        finally:
            self.keep(buf, pos)

    def one(self, buf: bytes, pos: int) -> tuple[int, str, bytes, int] | None:
        """The frame at `pos` and where it ends, or None while it is incomplete."""
        # The header is three SP-separated tokens; DATALEN ends at SP (data follows) or LF (no data).
        n = len(buf) - pos
        sp1 = buf.find(b" ", pos, pos + TXNR_DIGITS + 1)
        sp2 = buf.find(b" ", sp1 + 1, sp1 + 2 + COMMAND_MAX) if sp1 > pos else -1
        if sp2 < 0:
            if n > TXNR_DIGITS + 1 + COMMAND_MAX + 1 or (sp1 < 0 and n > TXNR_DIGITS):
                raise SyslogProtocolError(f"bad RELP header {buf[pos:pos + 48]!r}", reason="relp_bad_header")
            self._digits(buf[pos:sp1 if sp1 > pos else len(buf)], "TXNR", partial=True)
            return None
        txnr = self._digits(buf[pos:sp1], "TXNR")
        command = buf[sp1 + 1:sp2]
        if not command.isalpha():
            raise SyslogProtocolError(f"bad RELP command {command[:32]!r}", reason="relp_bad_header")
        end_len = sp2 + 1
        while end_len < len(buf) and 48 <= buf[end_len] <= 57 and end_len - sp2 <= 9:
            end_len += 1
        if end_len >= len(buf):
            if end_len - sp2 > 9:
                raise SyslogProtocolError("RELP DATALEN of more than 9 digits", reason="relp_bad_header")
            return None
        datalen = self._digits(buf[sp2 + 1:end_len], "DATALEN")
        if datalen > self.max_frame:
            raise FrameTooLarge(f"RELP frame of {datalen} bytes, the limit is {self.max_frame} (--max-frame-size)")
        sep = buf[end_len]
        if datalen == 0:
            if sep != 10:
                raise SyslogProtocolError("RELP frame with DATALEN 0 not ended by LF", reason="relp_bad_trailer")
            return txnr, command.decode(), b"", end_len + 1
        if sep != 32:
            raise SyslogProtocolError("RELP DATALEN not followed by SP", reason="relp_bad_header")
        end = end_len + 1 + datalen
        if len(buf) <= end:
            return None
        if buf[end] != 10:
            raise SyslogProtocolError("RELP frame not ended by LF after DATALEN bytes", reason="relp_bad_trailer")
        return txnr, command.decode(), buf[end_len + 1:end], end + 1

    @staticmethod
    def _digits(token: bytes, what: str, partial: bool = False) -> int:
        if partial and not token:
            return 0
        if not token.isdigit() or len(token) > 9:
            raise SyslogProtocolError(f"RELP {what} {token[:16]!r} is not a number", reason="relp_bad_header")
        return int(token)


def frame(txnr: int, command: str, data: bytes = b"") -> bytes:
    if not data:
        return b"%d %b 0\n" % (txnr, command.encode())
    return b"%d %b %d %b\n" % (txnr, command.encode(), len(data), data)


class _Half(HeldErrors):
    """What both halves share: the framer, the held error and the TXNRs awaiting their rsp."""

    __slots__ = ("_framer", "_error", "_unanswered")

    def __init__(self, max_frame: int) -> None:
        self._framer = _Framer(max_frame)
        self._error: RemoteProtocolError | None = None
        self._unanswered: deque[int] = deque()

    @property
    def mid_frame(self) -> bool:
        """Part of a frame has arrived, not all of it (the host's --frame-timeout runs)."""
        return bool(self._framer.buf)

    @property
    def unanswered(self) -> int:
        return len(self._unanswered)

    def feed(self, data: bytes) -> list[Any]:
        self._raise_held()
        framer = self._framer
        if data:
            framer.buf += data
        if framer.waiting():
            return []
        return self._until_error(self._events())

    def _events(self) -> Iterator[Any]:
        raise NotImplementedError


class RelpServer(_Half):
    """The receiving side (rsyslog's imrelp's role): `feed` gives `Open`, `Syslogs` runs and `Close`."""

    __slots__ = ("opened", "closed", "offers")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        super().__init__(max_frame)
        self.opened = False
        self.closed = False
        self.offers: dict[str, str] = {}

    def feed(self, data: bytes) -> list[Any]:
        self._raise_held()
        framer = self._framer
        if framer.buf:
            framer.buf += data
            if framer.waiting():
                return []
            buf = bytes(framer.buf)
        else:
            buf = bytes(data)
        events: list[Any] = []
        txnrs: list[int] = []
        raws: list[bytes] = []
        pos, end = 0, len(buf)
        error: RemoteProtocolError | None = None
        match, max_frame = _SYSLOG_HEADER.match, framer.max_frame
        try:
            while pos < end:
                # The frame nearly every one is, `TXNR syslog DATALEN DATA LF` with both numbers
                # free of leading zeros, read by one match; any other goes through the framer.
                m = match(buf, pos) if self.opened and not self.closed else None
                if m is not None:
                    datalen = int(m.group(2))
                    start = m.end()
                    stop = start + datalen
                    if datalen <= max_frame and stop < end and buf[stop] == 10:
                        txnrs.append(int(m.group(1)))
                        # rsyslog's RSYSLOG_SyslogProtocol23Format ends in LF, as over octet-counted TCP.
                        raws.append(buf[start:stop - 1] if buf[stop - 1] == 10 else buf[start:stop])
                        pos = stop + 1
                        continue
                got = framer.one(buf, pos)
                if got is None:
                    break
                if txnrs:
                    self._run(events, txnrs, raws)
                    txnrs, raws = [], []
                pos = got[3]
                self._command(events, got[0], got[1], got[2])
        except RemoteProtocolError as e:
            error = e
        if txnrs:
            self._run(events, txnrs, raws)
        framer.keep(buf, pos)
        return self._hold(events, error)

    def _run(self, events: list[Any], txnrs: list[int], raws: list[bytes]) -> None:
        self._unanswered.extend(txnrs)
        events.append(Syslogs(txnrs, raws))

    def _command(self, events: list[Any], txnr: int, command: str, data: bytes) -> None:
        """A frame the fast path did not take: the rules of the conversation, then its event."""
        if self.closed:
            raise SyslogProtocolError(f"RELP {command} after close", reason="relp_after_close")
        if txnr == 0 or txnr > MAX_TXNR:
            raise SyslogProtocolError(f"RELP TXNR {txnr} from a client", reason="relp_bad_txnr")
        if not self.opened and command != "open":
            raise SyslogProtocolError(f"RELP {command} before open", reason="relp_not_open")
        if command == "open":
            if self.opened:
                raise SyslogProtocolError("a second RELP open", reason="relp_reopen")
            self._unanswered.append(txnr)
            self.opened = True
            self.offers = _offers(data)
            events.append(Open(txnr, self.offers))
        elif command == "syslog":
            self._run(events, [txnr], [data[:-1] if data[-1:] == b"\n" else data])
        elif command == "close":
            self._unanswered.append(txnr)
            self.closed = True
            events.append(Close(txnr))
        else:
            raise SyslogProtocolError(f"RELP command {command!r} was not offered", reason="relp_unknown_command")

    def send(self, reply: Response | ServerClose) -> bytes:
        if isinstance(reply, ServerClose):
            return frame(0, "serverclose")
        if not self._unanswered or self._unanswered[0] != reply.txnr:
            raise LocalProtocolError(f"rsp {reply.txnr} out of order (oldest unanswered: "
                                     f"{self._unanswered[0] if self._unanswered else None})")
        self._unanswered.popleft()
        head = f"{reply.code} {reply.text}".encode()
        return frame(reply.txnr, "rsp", head + (b"\n" + reply.data if reply.data else b""))

    def send_ok(self, txnrs: Sequence[int]) -> bytes:
        """The bytes of `rsp 200 OK` for each of `txnrs`, the oldest unanswered in order: what
        `send(Response(txnr))` gives for each, joined (a settled batch's answers, in one write)."""
        unanswered = self._unanswered
        if len(unanswered) < len(txnrs):
            raise LocalProtocolError(f"rsp for {len(txnrs)} frames, {len(unanswered)} unanswered")
        popleft = unanswered.popleft
        for txnr in txnrs:
            if unanswered[0] != txnr:
                raise LocalProtocolError(f"rsp {txnr} out of order (oldest unanswered: {unanswered[0]})")
            popleft()
        return b"".join([b"%d rsp 6 200 OK\n" % txnr for txnr in txnrs])


class RelpClient(_Half):
    """The sending side (omrelp's role): `send` frames a command, `feed` gives `Response` and `ServerClose`."""

    __slots__ = ("_next",)

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        super().__init__(max_frame)
        self._next = 1

    def _take(self) -> int:
        txnr = self._next
        self._next = 1 if txnr == MAX_TXNR else txnr + 1
        self._unanswered.append(txnr)
        return txnr

    def send(self, command: str, data: bytes = b"") -> bytes:
        if command == "open" and not data:
            data = open_answer()  # the same offers a server answers with
        if command not in ("open", "syslog", "close"):
            raise LocalProtocolError(f"a RELP client does not send {command!r}")
        return frame(self._take(), command, data)

    def _events(self) -> Iterator[Any]:
        for txnr, command, data in self._framer.frames():
            if command == "serverclose" and txnr == 0:
                yield ServerClose()
                continue
            if command != "rsp":
                raise SyslogProtocolError(f"RELP server sent {command!r}", reason="relp_unknown_command")
            if not self._unanswered or self._unanswered[0] != txnr:
                raise SyslogProtocolError(f"rsp {txnr} answers nothing outstanding", reason="relp_bad_txnr")
            self._unanswered.popleft()
            head, _, rest = data.partition(b"\n")
            code, _, text = head.decode("utf-8", "replace").partition(" ")
            if not code.isdigit():
                raise SyslogProtocolError(f"rsp {txnr} without a status code", reason="relp_bad_rsp")
            yield Response(txnr, int(code), text, rest)
