"""`DeviceConfig`: everything a logjam-device is started with, built once from flags and TOML.

devices/cli.py builds it (`parse_config` with `DeviceConfig.from_flags`, which also applies
--instance and refuses what argparse cannot check), and both a start and `--check` read
that one frozen object. The CURVE flags become a `ServerCurve` (runtime/curve.py), which
reads the key files when the device starts.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from logjam import defaults, sockets
from logjam.meta import Compression
from runtime.config import from_flags
from runtime.curve import ServerCurve

# The flags --instance K moves by K * --instance-port-step.
PORT_FLAGS = ("router_port", "pull_port", "pub_port", "stats_port", "replay_port", "metrics_port")


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    router_port: int = defaults.ROUTER_PORT
    pull_port: int = defaults.PULL_PORT
    pub_port: int = defaults.PUB_PORT
    stats_port: int = defaults.STATS_PORT
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
    replay_port: int = defaults.REPLAY_PORT
    # With a data directory, every socket is served on <data_dir>/ipc/<name> too (logjam/endpoints.py).
    ipc: bool = True
    # Flow control: while an in-sync importer's committed position is further behind than this
    # (seconds), the device reads no input (devices/lag.py). 0 turns it off.
    max_importer_lag: float = 10.0
    importer_evict_after: float = 60.0
    max_importer_lag_messages: int = 500_000
    # CURVE (runtime/curve.py): None, or no key file in it, leaves every socket open (tests, benchmarks).
    curve: ServerCurve | None = None
    metrics_port: int | None = None  # Prometheus /metrics and /healthz; None: off
    verbose: bool = False

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "DeviceConfig":
        """The config of these flags with `--instance K` applied (this device's own id, ports and
        journal directory), or ValueError saying which flag is wrong."""
        k, values = args.instance, {}
        if k:
            values["device_id"] = args.device_id + k
            if values["device_id"] >= 2**32:
                raise ValueError(f"-d plus --instance {k} does not fit in 32 bits")
            values |= {name: getattr(args, name) + k * args.instance_port_step
                       for name in PORT_FLAGS if getattr(args, name)}
            if args.data_dir:
                values["data_dir"] = f"{args.data_dir.rstrip('/')}-{k}"
        return from_flags(cls, args, **{
            "compress": int(args.compress), "linger_ms": sockets.DEFAULT_LINGER_MS, "ipc": not args.no_ipc,
            "curve": ServerCurve.from_flags(args), **values,
        })
