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
from table.paths import default_warehouse, normalise_warehouse

MIB = 2**20


@dataclass(frozen=True, slots=True)
class MaintenanceConfig:
    """The --retention-days, --compact-*, --checkpoint-every, --log-retention-hours and --vacuum-grace-hours
    flags (warehouse/maintenance.py has their help). Every one is checked here, once, for logjam-spark's
    start, its --check and logjam-sql alike."""

    retention_days: int = 0  # 0: keep everything
    compact: bool = True  # compact on a schedule (--no-compact turns it off)
    compact_interval: float = 5.0  # seconds between passes (compaction and checkpoints)
    compact_min_files: int = 16  # an open day's small files that make its compaction due
    compact_open_target_bytes: int = 16 * MIB  # what an open day's files are merged into
    compact_target_bytes: int = 128 * MIB  # what a closed day's files are merged into
    compact_older_than: float = 3600.0  # a day is closed this long after it ended
    checkpoint_every: int = 100  # commits between checkpoints
    log_retention_hours: int = 168  # the log's history kept, `delta.logRetentionDuration`
    vacuum_grace_hours: int = 1  # a removed file's age before VACUUM deletes it
    maintenance_interval: float = 600.0  # seconds between retention, log cleanup and VACUUM

    def __post_init__(self) -> None:
        problems = [
            f"--{name.replace('_', '-')} must be {rule}" for name, ok, rule in (
                ("retention_days", self.retention_days >= 0, "0 (keep everything) or more"),
                ("compact_interval", self.compact_interval > 0, "more than 0 seconds"),
                ("compact_min_files", self.compact_min_files >= 2, "at least 2"),
                ("compact_open_target_bytes", self.compact_open_target_bytes >= MIB, "at least 1 MiB"),
                ("compact_target_bytes", self.compact_target_bytes >= self.compact_open_target_bytes,
                 "at least --compact-open-target-bytes"),
                ("compact_older_than", self.compact_older_than >= 0, "0 or more seconds"),
                ("checkpoint_every", self.checkpoint_every >= 1, "at least 1 commit"),
                ("log_retention_hours", self.log_retention_hours >= 1, "at least 1 hour"),
                ("vacuum_grace_hours", self.vacuum_grace_hours >= 0, "0 or more hours"),
                ("maintenance_interval", self.maintenance_interval > 0, "more than 0 seconds"),
            ) if not ok]
        if problems:
            raise ValueError("; ".join(problems))

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
