"""What logjam-spark is started with: `SparkServerConfig`, and the `MaintenanceConfig` it schedules.

warehouse/spark_server.py builds them once from flags and TOML (`SparkServerConfig.from_flags`);
the JVM's command line (warehouse/spark_jvm.py), its `--check`, its `/healthz` and the
maintenance passes read these frozen fields. `logjam-sql --compact` builds a
`MaintenanceConfig` of its own flags, the rest staying at these defaults.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from logjam.defaults import data_root
from runtime.config import from_flags
from table.protocol import DEFAULT_GRACE_S
from table.paths import default_warehouse, normalise_warehouse
from warehouse.tiers import FANIN, MAX_LEVEL, TARGET_BYTES


@dataclass(frozen=True, slots=True)
class MaintenanceConfig:
    """The --retention-days and --compact-* flags (warehouse/maintenance.py has their help)."""

    retention_days: int = 0  # 0: keep everything
    compact: bool = True  # compact on a schedule (--no-compact turns it off)
    compact_interval: float = 5.0
    compact_fanin: int = FANIN
    compact_max_level: int = MAX_LEVEL
    compact_throughput: float = 2.0  # MiB/s; 0: no limit
    compact_older_than: float = 3600.0
    compact_target_bytes: int = TARGET_BYTES
    compact_grace: float = DEFAULT_GRACE_S
    maintenance_interval: float = 600.0

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "MaintenanceConfig":
        return from_flags(cls, args)


@dataclass(frozen=True, slots=True)
class SparkServerConfig:
    master: str
    bind: str
    port: int
    jdbc_port: int  # 0: the Connect server alone
    warehouse: str  # normalised (an absolute path, or a URL)
    metastore: Path  # the embedded metastore's directory (unused with metastore_uri)
    metastore_uri: str | None
    database: str
    driver_memory: str
    stop_timeout: float  # after SIGTERM, the JVM's time to stop before it is killed
    conf: tuple[str, ...]  # --conf KEY=VALUE as given; warehouse/spark_jvm.py checks them
    metrics_port: int | None
    verbose: bool
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "SparkServerConfig":
        return from_flags(
            cls, args,
            warehouse=normalise_warehouse(args.warehouse or default_warehouse()),
            metastore=Path(args.metastore).resolve() if args.metastore else data_root() / "metastore",
            conf=tuple(args.conf or ()),
            maintenance=MaintenanceConfig.from_flags(args),
        )

    @property
    def host(self) -> str:
        """Where a client on this machine reaches the servers."""
        return "127.0.0.1" if self.bind in ("0.0.0.0", "::") else self.bind
