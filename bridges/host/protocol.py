"""What a protocol plugs into the host: a `BridgeProtocol` subclass, given a `Host`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, ClassVar

from bridges.host.budget import Budget
from bridges.host.config import HostConfig, Knobs
from bridges.host.connection import Connection
from bridges.host.link import DeviceLink
from bridges.host.mapping import EventMapper
from bridges.host.metrics import BridgeMetrics
from runtime.check import Checker
from runtime.health import Check


@dataclass
class Host:
    """The shared services a protocol session uses."""

    config: HostConfig
    link: DeviceLink
    mapper: EventMapper
    metrics: BridgeMetrics
    inflate: Budget  # decompressed bytes not yet acked, all connections together (--max-inflated-bytes)


class BridgeProtocol:
    """One shipper protocol: serves one client connection at a time per `serve` call."""

    name: ClassVar[str]
    default_port: ClassVar[int]
    default_max_frame: ClassVar[int]
    default_idle_timeout: ClassVar[float]
    # The protocol's own config: a frozen dataclass whose fields are its flags' names, made by
    # its classmethod `from_flags(args, host)` (which refuses bad values with a ValueError).
    Config: ClassVar[type]
    # Its defaults for the host's shared knobs (depth, batch size, keepalive) and their old names.
    knobs: ClassVar[Knobs] = Knobs()

    def __init__(self, config: Any, host: Host) -> None:
        self.config = config
        self.host = host

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Protocol-only flags; the common ones are added by the host."""

    @classmethod
    def check(cls, config: Any, host: HostConfig, checker: Checker) -> None:
        """--check: what the protocol's own flags would do (a second listener), besides the host's."""

    @classmethod
    def data_dir(cls, config: Any) -> str | None:
        """Where the protocol stores what it received (--data-dir), if it stores anything."""
        return None

    async def start(self) -> None:
        """Called once, before the listener opens (e.g. to recover a store)."""

    async def serve(self, conn: Connection) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Called once at shutdown, after every connection has finished."""

    def reload_tls(self) -> None:
        """SIGHUP, after the host reloaded its TLS files: a protocol's own listener reloads its copy."""

    def health_checks(self) -> list[Check]:
        """/healthz checks of the protocol's own (a second listener), besides the host's."""
        return []
