"""`--check` of logjam-importer (runtime/check.py): what it would connect to, read and write,
without starting Spark or connecting to anything."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from runtime.check import Checker
from table.checks import local_dir, spark_url


def check_importer(args: argparse.Namespace) -> int:
    from importer.checkpoint import default_state_dir
    from importer.worker import DEFAULT_SUB

    c = Checker("logjam-importer")
    spark_url(c, "--spark", args.spark)
    from importer.split import owned_endpoints

    subs = args.sub or [DEFAULT_SUB]
    if args.own_devices:  # validated already: it owns at least one
        subs = owned_endpoints(subs, args.worker, args.workers)
    for endpoint in subs:
        if not re.fullmatch(r"(tcp://[^:]+:\d+|ipc://.+)", endpoint):
            c.error(f"--sub {endpoint}: not tcp://HOST:PORT")
    state_dir = args.state_dir or str(default_state_dir())
    if not args.no_replay:
        c.writable_dir("--state-dir", state_dir)
    local_dir(c, "--warehouse", args.warehouse)
    port = args.metrics_port + args.metrics_port_offset if args.metrics_port else None
    c.port("--metrics-port (+ --metrics-port-offset)", port)
    c.port("--replay-port", args.replay_port)
    share = f"worker {args.worker} of {args.workers}" if args.workers else "all streams"
    if args.own_devices:
        share += ", owning its devices"
    c.would_run(f"importer ({share}): subscribe to {', '.join(subs)}, write {args.database}.messages through "
                f"{args.spark} in batches of at most {args.batch_bytes >> 20} MiB")
    c.would_run("no checkpoints, no replay" if args.no_replay else
                f"checkpoints in {Path(state_dir).absolute()}, replay from port "
                f"{','.join(str(getattr(args, 'replay_port_of', {}).get(s, args.replay_port)) for s in subs)}")
    c.would_run(f"metrics and /healthz on :{port}" if port else "no metrics port")
    from runtime.curve import check_client

    check_client(c, args)
    return c.report()
