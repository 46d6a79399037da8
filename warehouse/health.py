"""`/healthz` of logjam-spark: does its JVM run, and do its ports accept connections?"""

from __future__ import annotations

import subprocess

from runtime.health import Check
from warehouse.config import SparkServerConfig
from warehouse.spark_jvm import listening


def spark_server_health(proc: "subprocess.Popen[bytes]", config: SparkServerConfig) -> list[Check]:
    """logjam-spark: the JVM runs and its Spark Connect (and JDBC, when on) ports accept connections."""
    if proc.poll() is not None:
        return [Check("jvm", False, f"the Spark JVM exited with status {proc.returncode}")]
    checks = [Check("jvm", True, f"pid {proc.pid}")]
    ports = [("connect", config.port)] + ([("jdbc", config.jdbc_port)] if config.jdbc_port else [])
    for name, port in ports:
        up = listening(config.bind, port)
        checks.append(Check(name, up, f"port {port} {'accepts connections' if up else 'not answering (starting?)'}"))
    return checks
