"""Sans-IO RELP (rsyslog's Reliable Event Logging Protocol): server and client halves.

A frame is `TXNR SP COMMAND SP DATALEN [SP DATA] LF` (librelp's doc/relp.md; docs/protocols/syslog.md).
The client opens with `open` (its offers), sends one syslog message per `syslog` frame and
ends with `close`; the server answers each with an `rsp` of the same TXNR, in the order the
commands came, `200 OK` or `500 <reason>`. librelp keeps up to 128 frames unanswered and
sends every unanswered one again after a reconnect, so an `rsp 200` is the only thing that
lets it forget a message: the bridge sends it after the device's 202 (at-least-once).

`RelpServer.feed` returns `Open`, `Syslog` (one trailing LF of the message dropped, as in
a counted frame) and `Close` events; `send(Response(...))` is the
bytes of one `rsp`, and refuses an answer out of order. Before `open` only `open` is
allowed, and nothing after `close`. DATALEN is checked against `max_frame` before anything
is buffered for it. `RelpClient` is the mirror image, for the tests and `logjam-send`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
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

    __slots__ = ("max_frame", "buf")

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.buf = bytearray()

    def frames(self) -> Iterator[tuple[int, str, bytes]]:
        buf = self.buf
        while buf:
            frame = self._one(buf)
            if frame is None:
                return
            yield frame

    def _one(self, buf: bytearray) -> tuple[int, str, bytes] | None:
        # The header is three SP-separated tokens; DATALEN ends at SP (data follows) or LF (no data).
        sp1 = buf.find(b" ", 0, TXNR_DIGITS + 1)
        sp2 = buf.find(b" ", sp1 + 1, sp1 + 2 + COMMAND_MAX) if sp1 > 0 else -1
        if sp2 < 0:
            if len(buf) > TXNR_DIGITS + 1 + COMMAND_MAX + 1 or (sp1 < 0 and len(buf) > TXNR_DIGITS):
                raise SyslogProtocolError(f"bad RELP header {bytes(buf[:48])!r}", reason="relp_bad_header")
            self._digits(bytes(buf[:sp1 if sp1 > 0 else len(buf)]), "TXNR", partial=True)
            return None
        txnr = self._digits(bytes(buf[:sp1]), "TXNR")
        command = bytes(buf[sp1 + 1:sp2])
        if not command.isalpha():
            raise SyslogProtocolError(f"bad RELP command {command[:32]!r}", reason="relp_bad_header")
        end_len = sp2 + 1
        while end_len < len(buf) and 48 <= buf[end_len] <= 57 and end_len - sp2 <= 9:
            end_len += 1
        if end_len >= len(buf):
            if end_len - sp2 > 9:
                raise SyslogProtocolError("RELP DATALEN of more than 9 digits", reason="relp_bad_header")
            return None
        datalen = self._digits(bytes(buf[sp2 + 1:end_len]), "DATALEN")
        if datalen > self.max_frame:
            raise FrameTooLarge(f"RELP frame of {datalen} bytes, the limit is {self.max_frame} (--max-frame-size)")
        sep = buf[end_len]
        if datalen == 0:
            if sep != 10:
                raise SyslogProtocolError("RELP frame with DATALEN 0 not ended by LF", reason="relp_bad_trailer")
            del buf[:end_len + 1]
            return txnr, command.decode(), b""
        if sep != 32:
            raise SyslogProtocolError("RELP DATALEN not followed by SP", reason="relp_bad_header")
        end = end_len + 1 + datalen
        if len(buf) <= end:
            return None
        if buf[end] != 10:
            raise SyslogProtocolError("RELP frame not ended by LF after DATALEN bytes", reason="relp_bad_trailer")
        data = bytes(buf[end_len + 1:end])
        del buf[:end + 1]
        return txnr, command.decode(), data

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
        if data:
            self._framer.buf += data
        return self._until_error(self._events())

    def _events(self) -> Iterator[Any]:
        raise NotImplementedError


class RelpServer(_Half):
    """The receiving side (rsyslog's imrelp's role): `feed` gives `Open`, `Syslog` and `Close`."""

    __slots__ = ("opened", "closed", "offers")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        super().__init__(max_frame)
        self.opened = False
        self.closed = False
        self.offers: dict[str, str] = {}

    def _events(self) -> Iterator[Any]:
        for txnr, command, data in self._framer.frames():
            if self.closed:
                raise SyslogProtocolError(f"RELP {command} after close", reason="relp_after_close")
            if txnr == 0 or txnr > MAX_TXNR:
                raise SyslogProtocolError(f"RELP TXNR {txnr} from a client", reason="relp_bad_txnr")
            if not self.opened and command != "open":
                raise SyslogProtocolError(f"RELP {command} before open", reason="relp_not_open")
            self._unanswered.append(txnr)
            if command == "open":
                if self.opened:
                    raise SyslogProtocolError("a second RELP open", reason="relp_reopen")
                self.opened = True
                self.offers = _offers(data)
                yield Open(txnr, self.offers)
            elif command == "syslog":
                # rsyslog's RSYSLOG_SyslogProtocol23Format ends in LF, as over octet-counted TCP.
                yield Syslog(txnr, data[:-1] if data[-1:] == b"\n" else data)
            elif command == "close":
                self.closed = True
                yield Close(txnr)
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
