"""Lumberjack-specific support for the Lumberjack bridge and interop tests: where the Node
clients live and how the bridge is started (the shared helpers are in tests/bridge_support.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.bridge_support import BridgeProcess, start_bridge

NODE_DIR = Path(__file__).resolve().parent / "node"


def start_lumberjack(device_router: str, *extra: str, **kwargs: Any) -> BridgeProcess:
    """`logjam-bridge lumberjack` with keepalives every 0.5 s, so a test waiting on a window sees them soon."""
    return start_bridge("lumberjack", device_router, "--keepalive-interval", "0.5", *extra, **kwargs)
