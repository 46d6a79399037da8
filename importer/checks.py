"""`--check` of logjam-importer (runtime/check.py): what it would connect to, read and write,
without starting Spark or connecting to anything."""

from __future__ import annotations

import re
from pathlib import Path

from importer.config import ImporterConfig
from runtime.check import Checker
from table.checks import local_dir, spark_url
from table.event_time import EventWindow


def check_importer(config: ImporterConfig) -> int:
    """--check of the config a start would run with."""
    from importer.checkpoint import default_state_dir

    c = Checker("logjam-importer")
    spark_url(c, "--spark", config.spark)
    subs = config.owned  # validated already: with --own-devices it owns at least one
    for endpoint in subs:
        if not re.fullmatch(r"(tcp://[^:]+:\d+|ipc://.+)", endpoint):
            c.error(f"--sub {endpoint}: not tcp://HOST:PORT")
    state_dir = config.state_dir or str(default_state_dir())
    if not config.no_replay:
        c.writable_dir("--state-dir", state_dir)
    local_dir(c, "--warehouse", config.warehouse)
    port = config.metrics_port
    c.port("--metrics-port (+ --metrics-port-offset)", port)
    c.port("--replay-port", config.replay_port)
    share = f"worker {config.worker} of {config.workers}" if config.workers else "all streams"
    if config.own_devices:
        share += ", owning its devices"
    c.would_run(f"importer ({share}): subscribe to {', '.join(subs)}, write {config.database}.messages through "
                f"{config.spark} in batches of at most {config.batch_bytes >> 20} MiB")
    c.would_run("date partitions: " + EventWindow.for_retention(config.retention_days).describe()
                + "; other rows go to the day they arrived")
    c.would_run("no checkpoints, no replay" if config.no_replay else
                f"checkpoints in {Path(state_dir).absolute()}, replay from port {config.replay_ports(subs)}")
    c.would_run(f"metrics and /healthz on :{port}" if port else "no metrics port")
    config.curve.check(c, subs)
    return c.report()
