"""Who gets a connection slot: --max-connections, --max-connections-per-peer, and shedding
idle connections to make room; plus the log line and metric for refused TLS handshakes.

Without shedding, 2,000 clients that connect and say nothing hold every slot until their
idle timeout and lock out every real client. So when a limit is reached, the connection
that has been idle longest (waiting between frames, nothing written to it, for at least
--shed-idle-after seconds) is closed to admit the new one. A connection inside a frame,
or one the bridge is still answering (acks, keepalives), is never shed; closing an idle
one loses nothing, since nothing it sent is unacknowledged.
"""

from __future__ import annotations

import logging
import resource
import ssl
import time
from collections import Counter
from typing import Iterable

from bridges.host.connection import Connection
from runtime.ratelimit import RateLimitedLog

__all__ = ["Admission", "RateLimitedLog", "raise_open_file_limit", "tls_refusal_reason"]

log = logging.getLogger("logjam-bridge")


class Admission:
    """Per-peer-address counts and the choice of whom to shed."""

    def __init__(self, max_connections: int, max_per_peer: int, shed_idle_after: float) -> None:
        self.max_connections = max_connections
        self.max_per_peer = max_per_peer  # 0: no per-peer limit
        self.shed_idle_after = shed_idle_after  # 0: never shed
        self.per_peer: Counter[str] = Counter()
        self.live = 0  # admitted and not shed (a shed connection may still be closing)

    def _idlest(self, conns: Iterable[Connection]) -> Connection | None:
        if not self.shed_idle_after:
            return None
        now = time.monotonic()
        best: Connection | None = None
        best_idle = self.shed_idle_after
        for conn in conns:
            if conn.shed:
                continue
            idle = conn.idle_for(now)
            if idle >= best_idle:
                best, best_idle = conn, idle
        return best

    def admit(self, conn: Connection, open_conns: Iterable[Connection]) -> tuple[str | None, Connection | None]:
        """(refusal reason or None, the connection shed to make room or None)."""
        conns = list(open_conns)
        shed: Connection | None = None
        if self.max_per_peer and self.per_peer[conn.peer_host] >= self.max_per_peer:
            shed = self._idlest(c for c in conns if c.peer_host == conn.peer_host)
            if shed is None:
                return "per_peer", None
            self._drop(shed)
        if self.live >= self.max_connections:
            other = self._idlest(conns)
            if other is None:
                return "max_connections", shed
            self._drop(other)
            shed = shed or other
        self.live += 1
        self.per_peer[conn.peer_host] += 1
        conn.admitted = True
        return None, shed

    def _drop(self, conn: Connection) -> None:
        conn.shed_now()
        self.release(conn)

    def release(self, conn: Connection) -> None:
        """The connection ended (or was shed; counted once either way)."""
        if not conn.admitted:
            return
        conn.admitted = False
        self.live -= 1
        self.per_peer[conn.peer_host] -= 1
        if self.per_peer[conn.peer_host] <= 0:
            del self.per_peer[conn.peer_host]


def raise_open_file_limit(need: int = 0) -> None:
    """Raise the soft open-files limit to the hard one (every connection, and every open
    store file, is a descriptor); warn when even that is below `need`."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            soft = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    except (ValueError, OSError) as err:
        log.warning("could not raise the open-file limit: %s", err)
        return
    if soft < need:
        log.warning("the open-file limit (%d) is below --max-connections plus the bridge's own files (%d): "
                    "raise ulimit -n (supervisord: minfds)", soft, need)


def tls_refusal_reason(exc: BaseException) -> tuple[str, str]:
    """(a short metric label, the detail for the log line) for a failed TLS handshake."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "client_cert_rejected", exc.verify_message or str(exc)
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or "ssl_error").lower()
        if reason in ("http_request", "wrong_version_number", "unknown_protocol", "record_layer_failure",
                      "packet_length_too_long", "version_too_low", "unsupported_protocol"):
            return "not_tls", f"{reason} (plaintext or an old protocol on the TLS port?)"
        if "certificate" in reason:
            return "client_cert_rejected", reason
        return "tls_error", reason
    # asyncio aborts a handshake past ssl_handshake_timeout with this ConnectionAbortedError.
    if isinstance(exc, TimeoutError) or (isinstance(exc, ConnectionAbortedError) and "handshake is taking longer" in str(exc)):
        return "handshake_timeout", "no complete TLS handshake within --tls-handshake-timeout"
    return "connection_lost", str(exc) or exc.__class__.__name__
