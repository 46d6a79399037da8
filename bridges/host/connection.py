"""`Connection`: one accepted TCP/TLS client, the thin adapter between a session and asyncio streams."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from logjam.meta import now_ms


class IdleTimeout(Exception):
    """No bytes arrived from the client for --idle-timeout seconds."""


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
        idle_timeout: float,
        stopping: asyncio.Event,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._idle_timeout = idle_timeout
        self._stopping = stopping
        self.protocol = protocol
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.peer = f"{peer[0]}:{peer[1]}"
        self.tls = tls_details(writer)
        self.opened_at = time.monotonic()
        self._reset: ConnectionResetError | None = None

    @property
    def stopping(self) -> bool:
        """The process is shutting down: finish what is in flight and accept nothing new."""
        return self._stopping.is_set()

    async def read(self, n: int = 65536) -> bytes:
        """Up to `n` bytes; b"" at EOF or once the process is stopping."""
        if self._reset is not None:
            raise self._reset
        try:
            async with asyncio.timeout(self._idle_timeout):
                return await self._reader.read(n)
        except TimeoutError:
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
