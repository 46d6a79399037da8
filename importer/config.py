"""`ImporterConfig`: everything a logjam-importer worker is started with, built once from flags and TOML.

importer/cli.py builds it (`ImporterConfig.from_flags`, which also refuses what argparse cannot
check), and the worker, its `--check` and its `/healthz` read these frozen fields. The CURVE
flags become a `ClientCurve` (runtime/curve.py), which reads the key files at start and under --check.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Sequence

from logjam import defaults
from importer.split import StreamFilter, owned_endpoints, split_list
from runtime.config import from_flags
from runtime.curve import ClientCurve

DEFAULT_SUB = defaults.device_endpoint("pub")


@dataclass(frozen=True, slots=True)
class ImporterConfig:
    subs: tuple[str, ...]  # every --sub endpoint, in order (DEFAULT_SUB when none is given)
    spark: str
    warehouse: str | None
    database: str
    worker: int | None
    workers: int | None
    own_devices: bool
    app_env: tuple[str, ...]  # stream prefixes; empty: every stream
    flush_interval: float
    batch_bytes: int
    batch_rows: int | None
    write_timeout: float
    unhealthy_after: float  # --unhealthy-after: failing writes this long make /healthz unhealthy (importer/health.py)
    max_new_app_envs: int
    metrics_port: int | None  # --metrics-port plus --metrics-port-offset; None: off
    rcvhwm: int
    state_dir: str | None
    replay_port: int
    replay_port_of: Mapping[str, int]  # --replay-ports, by --sub endpoint; the rest use replay_port
    replay_timeout: float
    no_replay: bool
    dedupe_keys: int
    retention_days: int  # the table's retention (logjam-spark's): bounds how old an event time may pick its day
    curve: ClientCurve  # --keys, --curve-secret, --curve-server-key, --plaintext
    verbose: bool = False

    @property
    def worker_id(self) -> int:
        return self.worker if self.worker is not None else 0

    @property
    def owned(self) -> tuple[str, ...]:
        """The endpoints this worker subscribes to: all, or with --own-devices its own share."""
        return tuple(owned_endpoints(self.subs, self.worker, self.workers)) if self.own_devices else self.subs

    def replay_ports(self, subs: Sequence[str]) -> str:
        """The replay port of each of `subs`, comma-separated, for the log and --check."""
        return ",".join(str(self.replay_port_of.get(s, self.replay_port)) for s in subs)

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "ImporterConfig":
        """The config of these flags, or ValueError saying which flag is wrong."""
        subs = tuple(split_list(args.sub)) or (DEFAULT_SUB,)
        StreamFilter(args.worker, args.workers, args.app_env or ())  # raises ValueError for a bad share
        ports = split_list(args.replay_ports)
        if ports and (len(ports) != len(subs) or not all(p.isdigit() for p in ports)):
            raise ValueError(f"--replay-ports needs one port per --sub endpoint ({len(subs)}), "
                             f"got {args.replay_ports!r}")
        if args.own_devices:
            if args.workers is None:
                raise ValueError("--own-devices needs --worker and --workers")
            owned_endpoints(subs, args.worker, args.workers)
        if (args.batch_rows is not None and args.batch_rows < 1) or args.flush_interval <= 0 or args.batch_bytes < 1:
            raise ValueError("--batch-rows, --batch-bytes and --flush-interval must be positive")
        if args.dedupe_keys < 0:
            raise ValueError("--dedupe-keys must be 0 (off) or positive")
        if args.retention_days < 0:
            raise ValueError("--retention-days must be 0 (keep everything) or positive")
        if args.write_timeout <= 0:
            raise ValueError("--write-timeout must be positive")
        if args.unhealthy_after <= 0:
            raise ValueError("--unhealthy-after must be positive")
        return from_flags(
            cls, args, subs=subs, own_devices=bool(args.own_devices), app_env=tuple(args.app_env or ()),
            metrics_port=args.metrics_port + args.metrics_port_offset if args.metrics_port else None,
            replay_port_of=MappingProxyType(dict(zip(subs, map(int, ports)))), curve=ClientCurve.from_flags(args),
        )
