"""`--check` of logjam-importer, logjam-spark and logjam-sql (runtime/check.py): what each would
connect to, read and write, without starting Spark or connecting to anything."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
from pathlib import Path

from runtime.check import Checker

_SPARK_URL = re.compile(r"sc://[^/:]+(:\d+)?(/.*)?|local(\[(\d+|\*)(,\d+)?\])?|spark://\S+|yarn|k8s://\S+|mesos://\S+")


def _spark_url(c: Checker, flag: str, url: str) -> None:
    if _SPARK_URL.fullmatch(url):
        c.ok(f"{flag} {url}")
    else:
        c.error(f"{flag} {url}: not sc://HOST:PORT or a Spark master URL (local[*], spark://HOST:PORT, ...)")


def _local_dir(c: Checker, flag: str, path: str | None) -> None:
    """A warehouse may be a URL (hdfs://, s3a://): only local paths are checked."""
    if path and ("://" not in path or path.startswith("file://")):
        c.writable_dir(flag, path.removeprefix("file://"))


def check_importer(args: argparse.Namespace) -> int:
    from importer.checkpoint import default_state_dir
    from importer.worker import DEFAULT_SUB

    c = Checker("logjam-importer")
    _spark_url(c, "--spark", args.spark)
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
    _local_dir(c, "--warehouse", args.warehouse)
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


def check_spark_server(args: argparse.Namespace) -> int:
    from table.paths import data_dir, default_warehouse, normalise_warehouse
    from warehouse.spark_server import command

    c = Checker("logjam-spark")
    _spark_url(c, "--master", args.master)
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        c.error("Java 17+ is required for Spark, and 'java' is not on PATH (nor JAVA_HOME set)")
    else:
        c.ok(f"java: {shutil.which('java') or os.environ.get('JAVA_HOME')}")
    for flag in ("--port", "--jdbc-port", "--metrics-port"):
        c.port(flag, getattr(args, flag[2:].replace("-", "_")), zero_ok=flag == "--jdbc-port")
    c.distinct_ports({"--port": args.port, "--jdbc-port": args.jdbc_port, "--metrics-port": args.metrics_port})
    warehouse = normalise_warehouse(args.warehouse or default_warehouse())
    _local_dir(c, "--warehouse", warehouse)
    metastore = Path(args.metastore).resolve() if args.metastore else data_dir() / "metastore"
    if not args.metastore_uri:
        c.writable_dir("--metastore", metastore)
    argv = c.attempt("--conf settings", lambda: command(args, warehouse, metastore))
    if argv is not None:
        c.would_run(shlex.join(argv))
    c.would_run(f"metrics and /healthz on :{args.metrics_port}" if args.metrics_port else "no metrics port")
    return c.report()


def check_sql(args: argparse.Namespace) -> int:
    c = Checker("logjam-sql")
    _spark_url(c, "--spark", args.spark)
    _local_dir(c, "--warehouse", args.warehouse)
    if args.query is None and not (args.compact or args.retention_days):
        c.error("give a query, or --compact / --retention-days")
    if args.query is not None:
        c.would_run(f"on {args.spark}, database {args.database}: {args.query}")
    if args.compact:
        c.would_run(f"compact partitions of {args.database}.messages closed at least {args.older_than:g}s ago")
    if args.retention_days:
        c.would_run(f"drop partitions of {args.database}.messages older than {args.retention_days} days")
    return c.report()
