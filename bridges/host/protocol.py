"""What a protocol plugs into the host: a `BridgeProtocol` subclass, given a `Host`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

from bridges.host.budget import Budget
from bridges.host.connection import Connection
from bridges.host.link import DeviceLink
from bridges.host.mapping import EventMapper
from bridges.host.metrics import BridgeMetrics


@dataclass
class Host:
    """The shared services a protocol session uses."""

    args: argparse.Namespace
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

    def __init__(self, args: argparse.Namespace, host: Host) -> None:
        self.args = args
        self.host = host

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Protocol-only flags; the common ones are added by the host."""

    async def start(self) -> None:
        """Called once, before the listener opens (e.g. to recover a store)."""

    async def serve(self, conn: Connection) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Called once at shutdown, after every connection has finished."""
