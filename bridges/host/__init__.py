"""The host every bridge shares: server, device link, event mapping, metrics."""

from bridges.host.budget import InflateBudget
from bridges.host.connection import Connection, FrameTimeout, IdleTimeout
from bridges.host.link import DeviceLink, DeviceRejected
from bridges.host.mapping import Batches, EventMapper, Positions, body_and_raw, body_from_bytes, parse_timestamp
from bridges.host.metrics import BridgeMetrics
from bridges.host.protocol import BridgeProtocol, Host

__all__ = [
    "Batches",
    "BridgeMetrics",
    "BridgeProtocol",
    "Connection",
    "DeviceLink",
    "DeviceRejected",
    "EventMapper",
    "FrameTimeout",
    "Host",
    "IdleTimeout",
    "InflateBudget",
    "Positions",
    "body_and_raw",
    "body_from_bytes",
    "parse_timestamp",
]
