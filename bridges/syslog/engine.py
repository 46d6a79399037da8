"""Sans-IO syslog framing (RFC 6587 over TCP and TLS, RFC 5426 over UDP): server and client halves.

No sockets here. `SyslogServer.feed(bytes)` cuts a stream into syslog messages, handed over
as `Frames` runs (the messages of one read that share a framing, in order); `datagram_message(bytes)`
gives the message of one UDP datagram. The message inside a
frame is read by parse.py, which never fails: only the framing can be broken.

Over a stream there are two framings, and the first byte of each message tells them apart
(as rsyslog's imtcp does; docs/protocols/syslog.md): a digit begins octet counting
(`MSG-LEN SP MSG`, RFC 6587 3.4.1, the only framing of TLS, RFC 5425), anything else is
non-transparent framing, where LF ends the message (3.4.2). So a connection is detected
from its first message and may even switch (a relay merging two senders).

- A counted frame's length is checked against `max_frame` before anything is buffered for
  it, and a length with a leading zero, more than `LENGTH_DIGITS` digits or no SP is an
  error. rsyslog's RSYSLOG_SyslogProtocol23Format ends in LF, which then lies inside the
  frame: one trailing LF is dropped.
- An LF-framed message longer than `max_frame` without its LF is an error (rsyslog would
  cut it; a bound is what matters here). A CR before the LF is dropped and empty lines are
  skipped.

Syslog has no replies: `send` refuses everything, and a client that reads bytes from a
syslog server has met something else.
"""

from __future__ import annotations

from dataclasses import dataclass

from logjam.errors import FrameTooLarge, HeldErrors, LocalProtocolError, RemoteProtocolError

DEFAULT_MAX_FRAME = 64 * 1024  # rsyslog's default is 8 KiB, RFC 5425 receivers should take 8 KiB
LENGTH_DIGITS = 9  # MSG-LEN up to 999,999,999: beyond any --max-frame-size
OCTET_COUNTING = "octet-counting"
NON_TRANSPARENT = "lf"
DATAGRAM = "udp"


class SyslogProtocolError(RemoteProtocolError):
    """The peer broke RFC 6587 framing or RELP (bridges/syslog/relp.py); `reason` says which rule."""

    reason = "syslog_protocol_error"


@dataclass(frozen=True, slots=True)
class Frame:
    """One syslog message as the sender framed it (`raw`: the bytes inside the frame) and how."""

    raw: bytes
    framing: str


@dataclass(frozen=True, slots=True)
class Frames:
    """The messages one `feed` completed in a row, all framed one way: the bytes inside each
    frame (`raws`, in order) and how (`framing`). A run, not an object per message, since the
    bridge maps a run in one call."""

    framing: str
    raws: list[bytes]

    def frames(self) -> list[Frame]:
        """The run as one `Frame` per message."""
        return [Frame(raw, self.framing) for raw in self.raws]


def datagram_message(data: bytes) -> bytes:
    """The message of one UDP datagram (RFC 5426): trailing LF and NUL, which some senders add,
    dropped; empty when there is none."""
    return data.rstrip(b"\n\0")


class SyslogServer(HeldErrors):
    """The receiving side of a syslog stream: `feed` returns the messages `data` completes, as
    `Frames` runs (one per stretch of messages framed the same way)."""

    __slots__ = ("max_frame", "_buf", "_need", "_lf", "_error", "frames")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()  # what is left of the last reads: the start of a message
        # What that message waits for: its whole count (`_need` bytes), or an LF (`_lf`);
        # until then a read is only appended, so a message trickling in costs no rescans.
        self._need = 0
        self._lf = False
        self._error: RemoteProtocolError | None = None
        self.frames = 0

    @property
    def mid_frame(self) -> bool:
        """Part of a message has arrived, not all of it (the host's --frame-timeout runs)."""
        return bool(self._buf)

    def feed(self, data: bytes) -> list[Frames]:
        self._raise_held()
        pending = self._buf
        if pending:
            pending += data
            if len(pending) < self._need or (self._lf and b"\n" not in data and len(pending) <= self.max_frame + 1):
                return []
            buf = bytes(pending)
        else:
            buf = bytes(data)
        runs: list[Frames] = []
        pos, end = 0, len(buf)
        error: RemoteProtocolError | None = None
        # One pass over the buffer, cut once at the end: per message only a find and a
        # slice, where a buffer cut per message would move its head each time.
        while pos < end and error is None:
            start = pos
            if 48 <= buf[pos] <= 57:
                raws, pos, error = self._counted(buf, pos, end)
                framing = OCTET_COUNTING
            else:
                raws, pos, error = self._lines(buf, pos, end)
                framing = NON_TRANSPARENT
            if raws:
                runs.append(Frames(framing, raws))
                self.frames += len(raws)
            elif pos == start:  # a message begun, not complete
                break
        self._buf = bytearray(buf[pos:])
        self._need, self._lf = 0, False
        if self._buf and error is None:
            if 48 <= buf[pos] <= 57:
                sp = buf.find(b" ", pos, pos + LENGTH_DIGITS + 1)
                if sp > 0:  # a length `_counted` found valid
                    self._need = sp + 1 - pos + int(buf[pos:sp])
            else:
                self._lf = True
        return self._hold(runs, error)

    def _counted(self, buf: bytes, pos: int, end: int) -> tuple[list[bytes], int, RemoteProtocolError | None]:
        """The octet-counted messages from `pos` on, up to one that is incomplete, one that
        breaks the framing (the error) or one framed by LF; and where they end."""
        raws: list[bytes] = []
        append, max_frame, find = raws.append, self.max_frame, buf.find
        while pos < end and 48 <= buf[pos] <= 57:
            sp = find(b" ", pos, pos + LENGTH_DIGITS + 1)
            if sp < 0:
                if end - pos > LENGTH_DIGITS or not buf[pos:].isdigit():
                    return raws, pos, SyslogProtocolError(
                        f"octet-counted frame without a valid length: {buf[pos:pos + 16]!r}", reason="bad_frame_length")
                break
            digits = buf[pos:sp]
            if not digits.isdigit() or buf[pos] == 48:
                return raws, pos, SyslogProtocolError(f"octet-counted frame with length {digits[:16]!r}",
                                                      reason="bad_frame_length")
            n = int(digits)
            if n > max_frame:
                return raws, pos, FrameTooLarge(
                    f"syslog frame of {n} bytes, the limit is {max_frame} (--max-frame-size)")
            stop = sp + 1 + n
            if stop > end:
                break
            # One trailing LF inside the count is dropped (RSYSLOG_SyslogProtocol23Format); n >= 1.
            raw = buf[sp + 1:stop - 1] if buf[stop - 1] == 10 else buf[sp + 1:stop]
            pos = stop
            if raw:
                append(raw)
        return raws, pos, None

    def _lines(self, buf: bytes, pos: int, end: int) -> tuple[list[bytes], int, RemoteProtocolError | None]:
        """The LF-framed messages from `pos` on, up to one that is incomplete, one over
        `max_frame` (the error) or one that begins with a digit; and where they end."""
        raws: list[bytes] = []
        append, max_frame, find = raws.append, self.max_frame, buf.find
        while pos < end and not 48 <= buf[pos] <= 57:
            lf = find(b"\n", pos, pos + max_frame + 2)
            if lf < 0:
                if end - pos > max_frame + 1:
                    return raws, pos, FrameTooLarge(
                        f"LF-framed syslog message over {max_frame} bytes (--max-frame-size)")
                break
            # A CR before the LF is dropped; empty lines are skipped.
            stop = lf - 1 if lf > pos and buf[lf - 1] == 13 else lf
            if stop - pos > max_frame:
                return raws, pos, FrameTooLarge(
                    f"LF-framed syslog message of {stop - pos} bytes, the limit is {max_frame}")
            if stop > pos:
                append(buf[pos:stop])
            pos = lf + 1
        return raws, pos, None

    def send(self, reply: object) -> bytes:
        raise LocalProtocolError("syslog over TCP has no replies (RELP has: bridges/syslog/relp.py)")


class SyslogClient:
    """The sending side: `send(message)` frames one message; syslog servers send nothing back."""

    __slots__ = ("framing", "_error")

    def __init__(self, framing: str = OCTET_COUNTING) -> None:
        if framing not in (OCTET_COUNTING, NON_TRANSPARENT):
            raise ValueError(f"framing {framing!r}: {OCTET_COUNTING} or {NON_TRANSPARENT}")
        self.framing = framing
        self._error: RemoteProtocolError | None = None

    def send(self, message: bytes) -> bytes:
        if self.framing == OCTET_COUNTING:
            return b"%d %b" % (len(message), message)
        if b"\n" in message:
            raise LocalProtocolError("an LF-framed syslog message cannot hold LF")
        return message + b"\n"

    def feed(self, data: bytes) -> list[Frame]:
        if self._error is None and data:
            self._error = SyslogProtocolError(f"a syslog server sent {len(data)} bytes", reason="unexpected_data")
        if self._error is not None:
            raise self._error
        return []
