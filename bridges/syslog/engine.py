"""Sans-IO syslog framing (RFC 6587 over TCP and TLS, RFC 5426 over UDP): server and client halves.

No sockets here. `SyslogServer.feed(bytes)` cuts a stream into `Frame` events, one per
syslog message; `datagram(bytes)` is the same for one UDP datagram. The message inside a
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

from collections.abc import Iterator
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


def datagram(data: bytes) -> Frame | None:
    """One UDP datagram is one message (RFC 5426); trailing LF and NUL, which some senders add,
    are dropped. None for an empty datagram."""
    raw = data.rstrip(b"\n\0")
    return Frame(raw, DATAGRAM) if raw else None


class SyslogServer(HeldErrors):
    """The receiving side of a syslog stream: `feed` returns the frames `data` completes."""

    __slots__ = ("max_frame", "_buf", "_error", "frames")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._error: RemoteProtocolError | None = None
        self.frames = 0

    @property
    def mid_frame(self) -> bool:
        """Part of a message has arrived, not all of it (the host's --frame-timeout runs)."""
        return bool(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        self._raise_held()
        if data:
            self._buf += data
        return self._until_error(self._frames())

    def _frames(self) -> Iterator[Frame]:
        buf = self._buf
        while buf:
            if 48 <= buf[0] <= 57:
                frame = self._counted(buf)
            else:
                frame = self._line(buf)
            if frame is None:
                return
            if frame.raw:
                self.frames += 1
                yield frame

    def _counted(self, buf: bytearray) -> Frame | None:
        sp = buf.find(b" ", 0, LENGTH_DIGITS + 1)
        if sp < 0:
            if len(buf) > LENGTH_DIGITS or not buf.isdigit():
                raise SyslogProtocolError(f"octet-counted frame without a valid length: {bytes(buf[:16])!r}",
                                          reason="bad_frame_length")
            return None
        digits = bytes(buf[:sp])
        if not digits.isdigit() or digits[0] == 48:
            raise SyslogProtocolError(f"octet-counted frame with length {digits[:16]!r}", reason="bad_frame_length")
        n = int(digits)
        if n > self.max_frame:
            raise FrameTooLarge(f"syslog frame of {n} bytes, the limit is {self.max_frame} (--max-frame-size)")
        end = sp + 1 + n
        if len(buf) < end:
            return None
        raw = bytes(buf[sp + 1:end])
        del buf[:end]
        if raw[-1:] == b"\n":
            raw = raw[:-1]
        return Frame(raw, OCTET_COUNTING)

    def _line(self, buf: bytearray) -> Frame | None:
        lf = buf.find(b"\n", 0, self.max_frame + 2)
        if lf < 0:
            if len(buf) > self.max_frame + 1:
                raise FrameTooLarge(f"LF-framed syslog message over {self.max_frame} bytes (--max-frame-size)")
            return None
        raw = bytes(buf[:lf])
        del buf[:lf + 1]
        if raw[-1:] == b"\r":
            raw = raw[:-1]
        if len(raw) > self.max_frame:
            raise FrameTooLarge(f"LF-framed syslog message of {len(raw)} bytes, the limit is {self.max_frame}")
        return Frame(raw, NON_TRANSPARENT)

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
