"""The host every bridge shares: server, device link, forwarding pipeline, keepalive, event mapping, metrics."""

from bridges.host.budget import Budget
from bridges.host.connection import Connection, FrameTimeout, IdleTimeout
from bridges.host.keepalive import KeepaliveTimer
from bridges.host.link import DeviceLink, DeviceRejected
from bridges.host.mapping import Batches, EventMapper, Positions, body_and_raw, body_from_bytes, parse_timestamp
from bridges.host.metrics import BridgeMetrics
from bridges.host.pipeline import Pipeline, forward
from bridges.host.protocol import BridgeProtocol, Host

__all__ = [
    "Batches",
    "Budget",
    "BridgeMetrics",
    "BridgeProtocol",
    "Connection",
    "DeviceLink",
    "DeviceRejected",
    "EventMapper",
    "FrameTimeout",
    "Host",
    "IdleTimeout",
    "KeepaliveTimer",
    "Pipeline",
    "Positions",
    "body_and_raw",
    "body_from_bytes",
    "forward",
    "parse_timestamp",
]
