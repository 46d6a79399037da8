"""The Spark JVM `logjam-spark` runs: its `spark-submit` command line, its settings, and whether its ports answer.

Kept apart from the process around it (warehouse/spark_server.py), so that its `--check`
(warehouse/checks.py) and its `/healthz` (warehouse/health.py) read the same command and
probe without importing the server.
"""

from __future__ import annotations

import socket
from pathlib import Path

from table.session import CLASSIC_CONF, LOG4J_CONFIG, add_jars, delta_conf, driver_address
from warehouse.config import SparkServerConfig

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
THRIFT_SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
# Hadoop's local filesystem without its `chmod`/`ls` child processes (native/java/, built by
# native/jar.py at install; docs/operations.md says why). Without the jar, Hadoop's own runs.
LOCALFS_JAR = Path(__file__).with_name("jars") / "logjam-localfs.jar"
LOCALFS_CLASS = "logjam.fs.NioRawLocalFileSystem"
# The pools that keep compaction from delaying the importers' writes (the file says how).
SCHEDULER_POOLS = Path(__file__).with_name("fairscheduler.xml")


def spark_home() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


def spark_conf(config: SparkServerConfig) -> dict[str, str]:
    """Every Spark setting of the server: ours first, then `--conf`, which wins."""
    conf = {
        "spark.connect.grpc.binding.port": str(config.port),
        "spark.connect.grpc.binding.address": config.bind,
        "spark.sql.warehouse.dir": config.warehouse,
        "spark.sql.catalogImplementation": "hive",
        **CLASSIC_CONF,
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": f"file://{SCHEDULER_POOLS}",
    }
    if config.metastore_uri:
        conf["spark.hadoop.hive.metastore.uris"] = config.metastore_uri
    else:
        conf["spark.hadoop.javax.jdo.option.ConnectionURL"] = (
            f"jdbc:derby:;databaseName={config.metastore / 'metastore_db'};create=true")
        conf["spark.hadoop.datanucleus.schema.autoCreateAll"] = "true"
        conf["spark.hadoop.hive.metastore.schema.verification"] = "false"
    if config.jdbc_port:
        conf["spark.plugins"] = CONNECT_PLUGIN
        conf["spark.hadoop.hive.server2.thrift.port"] = str(config.jdbc_port)
        conf["spark.hadoop.hive.server2.thrift.bind.host"] = config.bind
    # Executors connect back to the driver: bind it where --bind says, and advertise an address
    # they can reach (for a cluster on other hosts: this host's address towards the master).
    if config.bind in ("0.0.0.0", "::"):
        conf["spark.driver.bindAddress"] = config.bind
        conf["spark.driver.host"] = driver_address(config.master)
    else:
        conf["spark.driver.bindAddress"] = conf["spark.driver.host"] = config.bind
    if LOCALFS_JAR.exists():
        conf["spark.hadoop.fs.file.impl"] = LOCALFS_CLASS
    for item in config.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"logjam-spark: --conf wants KEY=VALUE, got {item!r}")
        conf[key.strip()] = value
    # Delta's settings and jars, and the filesystem jar, added to what --conf gave, never replacing
    # it: fs.file.impl needs the class everywhere, the catalog needs Delta's.
    conf = delta_conf(conf, config.master)
    if LOCALFS_JAR.exists():
        add_jars(conf, [LOCALFS_JAR], config.master)
    return conf


def localfs_note() -> str | None:
    """One line for the log when the filesystem jar is missing, else None."""
    if LOCALFS_JAR.exists():
        return None
    return (f"{LOCALFS_JAR} is missing (built by `make venv` / `python native/jar.py`): using Hadoop's "
            "local filesystem, which forks a chmod for every new directory")


def command(config: SparkServerConfig) -> list[str]:
    java_options = [f"-Dderby.system.home={config.metastore}",
                    # A JVM out of heap is wedged, not dead; exit so supervisord restarts it.
                    "-XX:+ExitOnOutOfMemoryError"]
    if not config.verbose and LOG4J_CONFIG.exists():
        java_options.append(f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}")
    argv = [
        str(spark_home() / "bin" / "spark-submit"),
        "--class", THRIFT_SERVER_CLASS if config.jdbc_port else CONNECT_SERVER_CLASS,
        "--name", "logjam Spark server",
        "--master", config.master,
        "--driver-memory", config.driver_memory,
        "--driver-java-options", " ".join(java_options),
    ]
    for key, value in spark_conf(config).items():
        argv += ["--conf", f"{key}={value}"]
    return argv


def listening(host: str, port: int) -> bool:
    probe = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    try:
        with socket.create_connection((probe, port), timeout=0.5):
            return True
    except OSError:
        return False
