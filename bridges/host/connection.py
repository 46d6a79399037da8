"""`Connection`: one accepted TCP/TLS client, the thin adapter between a session and asyncio streams.

Besides the idle timeout (no bytes at all), a connection enforces a deadline for
progress: once a frame has begun (the reader says so: `read(mid_frame=True)`, which the
session passes from its engine's `mid_frame`), the client must finish it within --frame-timeout seconds of our waiting
for its bytes, however many single bytes trickle in meanwhile (slowloris). Time the
session spends not reading (back-pressure from the device) is not the client's fault
and does not count.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from logjam.errors import RemoteProtocolError
from logjam.meta import now_ms


class IdleTimeout(Exception):
    """No bytes arrived from the client for --idle-timeout seconds."""


class FrameTimeout(RemoteProtocolError):
    """A frame (or handshake, or append) the client began was not finished within --frame-timeout."""

    reason = "frame_timeout"


def tls_details(writer: asyncio.StreamWriter) -> dict[str, Any] | None:
    """Peer TLS facts for @metadata: subject, cn, version, cipher."""
    ssl_object = writer.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    cert = ssl_object.getpeercert() or {}
    subject = ", ".join(f"{k}={v}" for rdn in cert.get("subject", ()) for k, v in rdn)
    cn = next((v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"), None)
    cipher = ssl_object.cipher()
    return {
        "subject": subject or None,
        "cn": cn,
        "version": ssl_object.version(),
        "cipher": cipher[0] if cipher else None,
    }


class Connection:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        protocol: str,
        idle_timeout: float | None,
        stopping: asyncio.Event,
        frame_timeout: float | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._idle_timeout = idle_timeout
        self._frame_timeout = frame_timeout
        self._stopping = stopping
        self.protocol = protocol
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.peer_host = str(peer[0])
        self.peer = f"{peer[0]}:{peer[1]}"
        self.tls = tls_details(writer)
        self.opened_at = time.monotonic()
        self._reset: ConnectionResetError | None = None
        self._partial_waited = 0.0  # seconds spent waiting on the client inside the current frame
        self._idle_since: float | None = None  # set while waiting in read() between frames
        self.last_write = self.opened_at
        self.shed = False  # closed by the server to make room for a new client
        self.admitted = False  # counted against the connection limits (bridges.host.admission)

    def idle_for(self, now: float) -> float:
        """Seconds this connection has been waiting between frames with nothing written to it;
        0 while it is busy (inside a frame, or not reading because it has work in hand)."""
        since = self._idle_since
        if since is None:
            return 0.0
        return now - max(since, self.last_write)

    def update_tls(self) -> None:
        """After a STARTTLS-style upgrade of the transport, describe the TLS session."""
        self.tls = tls_details(self._writer)

    @property
    def stopping(self) -> bool:
        """The process is shutting down: finish what is in flight and accept nothing new."""
        return self._stopping.is_set()

    async def read(self, n: int = 65536, *, mid_frame: bool = False) -> bytes:
        """Up to `n` bytes; b"" at EOF or once the process is stopping. `mid_frame`: the
        engine holds part of a frame, so --frame-timeout bounds this wait."""
        if self._reset is not None:
            raise self._reset
        start = time.monotonic()
        partial = mid_frame
        timeout = self._idle_timeout
        frame_bound = False  # the frame deadline, not the idle timeout, ends this wait
        if not partial:
            self._partial_waited = 0.0
            self._idle_since = start
        elif self._frame_timeout:
            left = max(0.0, self._frame_timeout - self._partial_waited)
            frame_bound = timeout is None or left <= timeout
            timeout = left if frame_bound else timeout
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(n)
        except TimeoutError:
            if frame_bound:
                raise FrameTimeout(
                    f"{self.peer} did not finish a frame within {self._frame_timeout:g}s (--frame-timeout)"
                ) from None
            raise IdleTimeout(f"no data from {self.peer} for {self._idle_timeout:g}s") from None
        except ConnectionResetError as e:
            # StreamReader raises a reset before handing over bytes it had already
            # received. Clients that never read (stashward) reset when they close, and
            # what they sent before is still theirs to deliver: return it, raise next time.
            buffered = self._reader._buffer
            if not buffered:
                raise
            self._reset = e
            data = bytes(buffered)
            buffered.clear()
            return data
        finally:
            self._idle_since = None
            if partial:
                self._partial_waited += time.monotonic() - start

    def stop_reading(self) -> None:
        """Shutdown: read no more from the client; `read` returns what is buffered, then b""."""
        transport = self._writer.transport
        if not transport.is_closing():
            transport.pause_reading()
        if not self._reader.at_eof():
            self._reader.feed_eof()

    def write(self, data: bytes) -> None:
        """One transport write per call (clients like pylogbeat rely on whole acks)."""
        if not self._writer.is_closing():
            self._writer.write(data)
            self.last_write = time.monotonic()

    def shed_now(self) -> None:
        """Close an idle connection to make room: its pending read sees EOF and the session ends."""
        self.shed = True
        if not self._writer.is_closing():
            self._writer.close()

    async def drain(self) -> None:
        await self._writer.drain()

    @property
    def closed(self) -> bool:
        return self._writer.is_closing()

    def metadata(self, protocol_version: str) -> dict[str, Any]:
        """The base @metadata every bridge adds; protocols add their own position fields."""
        meta: dict[str, Any] = {
            "protocol": self.protocol,
            "protocol_version": protocol_version,
            "peer": self.peer,
            "received_at": now_ms(),
        }
        if self.tls is not None:
            meta["tls"] = self.tls
        return meta

    async def close(self) -> None:
        if not self._writer.is_closing():
            self._writer.close()
        try:
            await asyncio.wait_for(self._writer.wait_closed(), 5)
        except Exception:  # the peer may already be gone; closing is best effort
            pass
