"""What a bridge is started with: `BridgeConfig`, that is `HostConfig` (the flags every bridge
has, the TLS part among them) and the protocol's own config (`BridgeProtocol.Config`).

bridges/cli.py builds it once from flags and TOML (runtime/config.py's `parse_config`), and
both a start and `--check` read that one object: every flag is validated here, while it is
built (a ValueError names the flag), so the rest of the code reads typed, frozen fields
rather than an `argparse.Namespace` that anything could change.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from logjam import defaults
from runtime.config import from_flags
from runtime.curve import ClientCurve


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """--tls-*: TLS is on when `cert` is set (bridges/host/tls.py)."""

    cert: str | None = None
    key: str | None = None
    key_password: str | None = None
    client_ca: str | None = None
    client_auth: str | None = None  # none, optional, required; None: required with a client CA
    handshake_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.cert and not self.key:
            raise ValueError("--tls-cert needs --tls-key")
        if self.cert and self.auth != "none" and not self.client_ca:
            raise ValueError(f"--tls-client-auth {self.auth} needs --tls-client-ca")

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "TLSConfig":
        return from_flags(cls, args, prefix="tls_")

    @property
    def auth(self) -> str:
        return self.client_auth or ("required" if self.client_ca else "none")


@dataclass(frozen=True, slots=True)
class Knobs:
    """A protocol's defaults for the host's shared knobs, each one flag for every protocol
    (None: the protocol has no such knob, and no such flag):

    - `--pipeline-depth`: batches awaiting the device per connection before it stops reading;
    - `--batch-size`: events per publish to the device;
    - `--keepalive-interval`: how often a client whose events wait for the device is told so
      (at most `max_keepalive_interval`, where its clients give up soon).

    `renamed` pairs each name a protocol took a knob by before with the knob, both as argparse
    dests (`max_batch` is `--max-batch` and the TOML key `max-batch`): accepted for one release,
    with a deprecation warning at start.
    """

    pipeline_depth: int | None = None
    batch_size: int | None = None
    keepalive_interval: float | None = None
    max_keepalive_interval: float | None = None
    renamed: tuple[tuple[str, str], ...] = ()


KNOBS = ("pipeline_depth", "batch_size", "keepalive_interval")


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


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
    curve: ClientCurve  # to the devices: --keys, --curve-secret, --curve-server-key, --plaintext
    # The shared knobs (`Knobs`); None where the protocol has none.
    pipeline_depth: int | None = None
    batch_size: int | None = None
    keepalive_interval: float | None = None
    device_deadline: float = 5.0  # --device-deadline (bridges/host/link.py)
    homes_file: str | None = None  # --homes-file (bridges/host/homes.py)
    # (old flag, new flag) for each old name given, to warn about once at start.
    deprecated: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_flags(cls, args: argparse.Namespace, knobs: Knobs = Knobs()) -> "HostConfig":
        # One flag may carry every device of a mesh, comma-separated (supervisord passes one value).
        devices = tuple(d.strip() for v in (args.device or [defaults.device_endpoint("router")]) for d in v.split(",") if d.strip())
        for endpoint in devices:
            scheme, _, rest = endpoint.partition("://")
            if scheme not in ("tcp", "ipc") or not rest or (scheme == "tcp" and not rest.rpartition(":")[2].isdigit()):
                raise ValueError(f"--device {endpoint}: not tcp://HOST:PORT nor ipc://PATH")
        if args.device_deadline <= 0:
            raise ValueError("--device-deadline must be positive")
        values, deprecated = _knob_values(args, knobs)
        return from_flags(cls, args, device=devices, tls=TLSConfig.from_flags(args), curve=ClientCurve.from_flags(args),
                          deprecated=deprecated, **values)


def _knob_values(args: argparse.Namespace, knobs: Knobs) -> tuple[dict[str, Any], tuple[tuple[str, str], ...]]:
    """Each knob's value: its flag, else an old name of it, else the protocol's default."""
    values: dict[str, Any] = {}
    given: dict[str, str] = {}  # knob -> the flag its value came from, for error messages
    deprecated = []
    for name in KNOBS:
        default = getattr(knobs, name)
        value = getattr(args, name, None) if default is not None else None
        given[name] = flag(name)
        for old, new in knobs.renamed:
            if new == name and getattr(args, old) is not None:
                deprecated.append((flag(old), flag(new)))
                if value is None:
                    value, given[name] = getattr(args, old), flag(old)
        values[name] = default if value is None else value
    top = knobs.max_keepalive_interval
    if top is not None and not 0 < values["keepalive_interval"] <= top:
        raise ValueError(f"{given['keepalive_interval']} must be in (0, {top:g}] seconds")
    return values, tuple(deprecated)


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    """Everything one bridge process runs with, built once: what `--check` reads is what runs."""

    host: HostConfig
    protocol: Any  # the protocol's frozen `Config`

    @classmethod
    def builder(cls, protocol_config: Any, knobs: Knobs) -> Callable[[argparse.Namespace], "BridgeConfig"]:
        """For `parse_config`: the host's config (with the protocol's `knobs`) and then the
        protocol's own (`protocol_config.from_flags(args, host)`)."""
        def build(args: argparse.Namespace) -> BridgeConfig:
            host = HostConfig.from_flags(args, knobs)
            return cls(host, protocol_config.from_flags(args, host))
        return build
