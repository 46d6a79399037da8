"""`--check` of logjam-spark (runtime/check.py): what it would start, listen on and write, without
starting Spark."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
from pathlib import Path

from runtime.check import Checker
from table.checks import local_dir, spark_url
from table.paths import data_dir, default_warehouse, normalise_warehouse
from warehouse.spark_jvm import command


def check_spark_server(args: argparse.Namespace) -> int:
    c = Checker("logjam-spark")
    spark_url(c, "--master", args.master)
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        c.error("Java 17+ is required for Spark, and 'java' is not on PATH (nor JAVA_HOME set)")
    else:
        c.ok(f"java: {shutil.which('java') or os.environ.get('JAVA_HOME')}")
    for flag in ("--port", "--jdbc-port", "--metrics-port"):
        c.port(flag, getattr(args, flag[2:].replace("-", "_")), zero_ok=flag == "--jdbc-port")
    c.distinct_ports({"--port": args.port, "--jdbc-port": args.jdbc_port, "--metrics-port": args.metrics_port})
    warehouse = normalise_warehouse(args.warehouse or default_warehouse())
    local_dir(c, "--warehouse", warehouse)
    metastore = Path(args.metastore).resolve() if args.metastore else data_dir() / "metastore"
    if not args.metastore_uri:
        c.writable_dir("--metastore", metastore)
    argv = c.attempt("--conf settings", lambda: command(args, warehouse, metastore))
    if argv is not None:
        c.would_run(shlex.join(argv))
    c.would_run(f"metrics and /healthz on :{args.metrics_port}" if args.metrics_port else "no metrics port")
    return c.report()
