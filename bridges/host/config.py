"""What a bridge is started with: `HostConfig` (the flags every bridge has) and the TLS part.

bridges/cli.py builds them once from flags and TOML (runtime/config.py), with each
protocol's own config beside them (`BridgeProtocol.Config`), so the rest of the code reads
typed, frozen fields rather than an `argparse.Namespace` that anything could change.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from runtime.config import from_flags


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """--tls-*: TLS is on when `cert` is set (bridges/host/tls.py)."""

    cert: str | None = None
    key: str | None = None
    key_password: str | None = None
    client_ca: str | None = None
    client_auth: str | None = None  # none, optional, required; None: required with a client CA
    handshake_timeout: float = 10.0

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "TLSConfig":
        return cls(args.tls_cert, args.tls_key, args.tls_key_password, args.tls_client_ca, args.tls_client_auth,
                   args.tls_handshake_timeout)

    @property
    def auth(self) -> str:
        return self.client_auth or ("required" if self.client_ca else "none")


@dataclass(frozen=True, slots=True)
class HostConfig:
    """The flags bridges/cli.py gives every bridge (their help text is there)."""

    listen: str
    device: tuple[str, ...]
    app_env: str
    app_env_field: str | None
    topic: str
    compress: str
    tls: TLSConfig
    max_frame_size: int
    idle_timeout: float
    frame_timeout: float
    max_connections: int
    max_connections_per_peer: int
    shed_idle_after: float
    max_inflated_bytes: int
    max_inflight: int
    metrics_port: int | None

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "HostConfig":
        # One flag may carry every device of a mesh, comma-separated (supervisord passes one value).
        devices = tuple(d.strip() for v in (args.device or ["tcp://127.0.0.1:9604"]) for d in v.split(",") if d.strip())
        return from_flags(cls, args, device=devices, tls=TLSConfig.from_flags(args))
