"""`--check` of logjam-spark (runtime/check.py): what it would start, listen on and write, without
starting Spark."""

from __future__ import annotations

import os
import shlex
import shutil

from runtime.check import Checker
from table.checks import local_dir, spark_url
from warehouse.config import SparkServerConfig
from warehouse.spark_jvm import command


def check_spark_server(config: SparkServerConfig) -> int:
    c = Checker("logjam-spark")
    spark_url(c, "--master", config.master)
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        c.error("Java 17+ is required for Spark, and 'java' is not on PATH (nor JAVA_HOME set)")
    else:
        c.ok(f"java: {shutil.which('java') or os.environ.get('JAVA_HOME')}")
    ports = {"--port": config.port, "--jdbc-port": config.jdbc_port, "--metrics-port": config.metrics_port}
    for flag, port in ports.items():
        c.port(flag, port, zero_ok=flag == "--jdbc-port")
    c.distinct_ports(ports)
    local_dir(c, "--warehouse", config.warehouse)
    if not config.metastore_uri:
        c.writable_dir("--metastore", config.metastore)
    argv = c.attempt("--conf settings", lambda: command(config))
    if argv is not None:
        c.would_run(shlex.join(argv))
    c.would_run(f"metrics and /healthz on :{config.metrics_port}" if config.metrics_port else "no metrics port")
    return c.report()
