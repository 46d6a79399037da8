"""`DeviceConfig`: everything a logjam-device is started with (devices/cli.py fills it from flags and TOML)."""

from __future__ import annotations

from dataclasses import dataclass

from logjam import sockets
from logjam.meta import Compression
from runtime.curve import ServerCurve


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    router_port: int = 9604
    pull_port: int = 9605
    pub_port: int = 9606
    stats_port: int = 9621
    bind: str = "*"
    device_id: int = 0
    compress: int = Compression.NONE
    rcv_hwm: int = 100_000
    snd_hwm: int = 1_000_000
    heartbeat_interval: float = 5.0
    linger_ms: int = sockets.DEFAULT_LINGER_MS
    # The journal: off without a data directory.
    data_dir: str | None = None
    journal_fsync: str = "interval"
    journal_fsync_interval_ms: int = 100
    journal_segment_bytes: int = 64 * 1024 * 1024
    journal_retention_bytes: int = 1024 * 1024 * 1024  # 0: no size limit
    journal_retention_hours: float = 24.0  # 0: no age limit
    replay_port: int = 9607
    # With a data directory, every socket is served on <data_dir>/ipc/<name> too (logjam/endpoints.py).
    ipc: bool = True
    # Flow control: while an in-sync importer's committed position is further behind than this
    # (seconds), the device reads no input (devices/lag.py). 0 turns it off.
    max_importer_lag: float = 10.0
    importer_evict_after: float = 60.0
    max_importer_lag_messages: int = 500_000
    # CURVE (runtime/curve.py): None, or no key in it, leaves every socket open (tests, benchmarks).
    curve: ServerCurve | None = None
