"""Server TLS from the common flags (`TLSConfig`): certificate, key, optional client CA and client auth.

`ReloadableTLS` lets SIGHUP swap in freshly read files without dropping anyone: asyncio
keeps serving one context, whose SNI callback (OpenSSL calls it for every ClientHello,
with or without a server name) moves each new handshake onto the newest context. An
established connection keeps the certificate it was set up with; a reload whose files
do not load is refused and the previous context stays in use.
"""

from __future__ import annotations

import hashlib
import logging
import ssl

from bridges.host.config import TLSConfig

log = logging.getLogger("logjam-bridge")


def server_context(tls: TLSConfig) -> ssl.SSLContext | None:
    """None when TLS is off (no --tls-cert); raises OSError or ssl.SSLError for bad files (the
    flags themselves were checked when `tls` was built)."""
    if not tls.cert:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # TLS 1.3 session tickets that a never-reading client (stashward) leaves unread turn
    # its close into a TCP reset, and its kernel then discards data it had not sent yet.
    ctx.num_tickets = 0
    ctx.load_cert_chain(tls.cert, tls.key, password=tls.key_password)
    auth = tls.auth
    if auth != "none":
        ctx.load_verify_locations(cafile=tls.client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED if auth == "required" else ssl.CERT_OPTIONAL
    return ctx


def fingerprint(path: str) -> str:
    """A short SHA-256 of a certificate file's first certificate, for log lines."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            pem = f.read()
    except OSError:
        return "?"
    start = pem.find("-----BEGIN CERTIFICATE-----")
    end = pem.find("-----END CERTIFICATE-----", start)
    if start < 0 or end < 0:
        return "?"
    der = ssl.PEM_cert_to_DER_cert(pem[start:end + len("-----END CERTIFICATE-----")])
    return hashlib.sha256(der).hexdigest()[:16]


class ReloadableTLS:
    """The server's TLS: `context` for asyncio, `reload()` on SIGHUP."""

    def __init__(self, tls: TLSConfig) -> None:
        self.tls = tls
        self.context = server_context(tls)
        self.current = self.context
        self.reloads = 0
        self.reload_failures = 0
        if self.context is not None:
            self.context.sni_callback = self._pick

    def _pick(self, sslobj: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        current = self.current
        if current is not None and current is not ctx:
            sslobj.context = current  # this handshake continues with the newest certificate
        return None

    def reload(self) -> bool:
        """Read the TLS files again; True when new handshakes now use them."""
        if self.context is None:
            log.info("SIGHUP: TLS is off; nothing to reload")
            return False
        try:
            fresh = server_context(self.tls)
        except (OSError, ValueError, ssl.SSLError) as e:
            self.reload_failures += 1
            log.error("SIGHUP: cannot reload TLS files (%s); keeping the previous certificate", e)
            return False
        self.current = fresh
        self.reloads += 1
        log.info("SIGHUP: reloaded TLS certificate %s (sha256 %s); new connections use it, open ones keep theirs",
                 self.tls.cert, fingerprint(self.tls.cert))  # type: ignore[arg-type]
        return True
