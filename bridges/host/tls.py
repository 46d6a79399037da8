"""Server TLS from the common flags: certificate, key, optional client CA and client auth."""

from __future__ import annotations

import argparse
import ssl


def server_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """None when TLS is off (no --tls-cert)."""
    if not args.tls_cert:
        return None
    if not args.tls_key:
        raise ValueError("--tls-cert needs --tls-key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # TLS 1.3 session tickets that a never-reading client (stashward) leaves unread turn
    # its close into a TCP reset, and its kernel then discards data it had not sent yet.
    ctx.num_tickets = 0
    ctx.load_cert_chain(args.tls_cert, args.tls_key, password=args.tls_key_password)
    auth = args.tls_client_auth or ("required" if args.tls_client_ca else "none")
    if auth != "none":
        if not args.tls_client_ca:
            raise ValueError(f"--tls-client-auth {auth} needs --tls-client-ca")
        ctx.load_verify_locations(cafile=args.tls_client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED if auth == "required" else ssl.CERT_OPTIONAL
    return ctx
