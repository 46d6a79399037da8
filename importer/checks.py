"""`--check` of logjam-importer (runtime/check.py): what it would connect to, read and write,
without opening the table or connecting to anything."""

from __future__ import annotations

import re

from importer.config import ImporterConfig
from logjam.defaults import data_root
from runtime.check import Checker
from table.checks import local_dir, spark_url
from table.event_time import EventWindow


def check_importer(config: ImporterConfig) -> int:
    """--check of the config a start would run with."""
    c = Checker("logjam-importer")
    spark_url(c, "--spark", config.spark)
    subs = config.owned  # validated already: with --own-devices it owns at least one
    for endpoint in subs:
        if not re.fullmatch(r"(tcp://[^:]+:\d+|ipc://.+)", endpoint):
            c.error(f"--sub {endpoint}: not tcp://HOST:PORT")
    state_dir = config.state_dir or str(data_root() / "importer")
    c.writable_dir("--state-dir", state_dir)
    local_dir(c, "--warehouse", config.warehouse)
    port = config.metrics_port
    c.port("--metrics-port (+ --metrics-port-offset)", port)
    c.port("--replay-port", config.replay_port)
    share = f"worker {config.worker} of {config.workers}" if config.workers else "all streams"
    if config.own_devices:
        share += ", owning its devices"
    where = f"{config.warehouse}/messages" if config.warehouse else f"the warehouse of {config.spark}"
    c.would_run(f"importer ({share}): subscribe to {', '.join(subs)}, commit to the Delta table {where} "
                f"in batches of at most {config.batch_bytes >> 20} MiB")
    c.would_run("date partitions: " + EventWindow.for_retention(config.retention_days).describe()
                + "; other rows go to the day they arrived")
    c.would_run("no replay" if config.no_replay else
                f"resume from the table's app transactions, replay from port {config.replay_ports(subs)}")
    c.would_run(f"metrics and /healthz on :{port}" if port else "no metrics port")
    config.curve.check(c, subs)
    return c.report()
