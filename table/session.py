"""Spark sessions for importers and logjam-sql: Connect clients of `logjam-spark`, or classic in-process sessions.

`--spark` picks the session: `sc://...` is a Spark Connect client (the default, a thin
client of `logjam-spark`); anything else (`local[*]`, `spark://host:7077`, `yarn`) is a
master URL for a classic in-process session, which costs a JVM per process. Either reads the
table as Delta: a classic session gets the same Delta settings and jars as `logjam-spark`'s JVM
(`delta_conf`), so that `logjam.messages` and ``delta.`<path>` `` mean the same in both.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Mapping, Sequence

from logjam import defaults
from table.paths import default_warehouse

log = logging.getLogger(__name__)

DEFAULT_SPARK = f"sc://127.0.0.1:{defaults.SPARK_PORT}"
WAREHOUSE_CONF = "spark.sql.warehouse.dir"
# Scheduler pools of logjam-spark (warehouse/fairscheduler.xml): the importers' writes first.
INGEST_POOL = "ingest"
MAINTENANCE_POOL = "maintenance"
# Spark's own logging, cut to what an operator needs: classic sessions and logjam-spark's JVM use it.
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")

# What every classic session gets; `logjam-spark` sets the same on its server (warehouse/spark_jvm.py).
CLASSIC_CONF: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    # Timestamps as INT64 microseconds, as pyarrow and delta-rs write them, in whatever Spark writes:
    # Spark's default (INT96) gets no min/max statistics and no page index from parquet-mr.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}

# The table is a Delta table (table/delta.py): every Spark that reads it, logjam-spark's JVM and
# every classic session alike, gets Delta's SQL extension and catalog (and its jars, `delta_conf`).
DELTA_CONF: Mapping[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # A snapshot's state is rebuilt from the log in this many tasks (Delta's default: 50). The
    # table's log is checkpointed by maintenance and small, and on 2 cores 50 tasks cost more in
    # scheduling than they read.
    "spark.databricks.delta.snapshotPartitions": "2",
    # A lookup of one id (tools/trace.py) is skipped file by file by the log's min/max statistics,
    # then row group by row group by the Parquet bloom filters the writers add on the lookup
    # columns (table/delta.py): both need the filter pushed into the Parquet reader.
    "spark.sql.parquet.filterPushdown": "true",
    "spark.hadoop.parquet.filter.bloom.enabled": "true",
}


def add_jars(conf: dict[str, str], jars: Sequence[Path], master: str) -> None:
    """Put `jars` on the driver's classpath (every class loader of it sees them; local masters run
    their tasks in the driver) and, on a cluster, ship them to the executors. Appended to what
    `conf` already names, never replacing it."""
    if not jars:
        return
    _append(conf, "spark.driver.extraClassPath", os.pathsep.join(str(j) for j in jars), os.pathsep)
    if not master.startswith("local"):
        _append(conf, "spark.jars", ",".join(str(j) for j in jars), ",")


def _append(conf: dict[str, str], key: str, value: str, sep: str) -> None:
    conf[key] = f"{conf[key]}{sep}{value}" if conf.get(key) else value


def delta_conf(conf: Mapping[str, str], master: str) -> dict[str, str]:
    """`conf` over DELTA_CONF, with Delta's jars (runtime/jars.py's `delta` set) added to its classpath:
    what a Spark JVM for `master` needs to read and name the table. `JarsMissing` says which make
    target installs the jars when they are not there."""
    from runtime.jars import jar_paths

    out = {**DELTA_CONF, **conf}
    add_jars(out, jar_paths("delta"), master)
    return out


def is_connect(url: str) -> bool:
    return url.startswith("sc://")


def driver_address(master: str) -> str:
    """The address a classic driver binds and advertises: 127.0.0.1 for local masters and masters on
    this host, else the local address this host uses to reach the master (never a guess among NICs)."""
    if master.startswith("local"):
        return "127.0.0.1"
    host = urllib.parse.urlparse(master.split(",")[0]).hostname or ""
    if host in ("", "localhost") or host.startswith("127."):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 7077))  # no packet is sent for a UDP connect
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def open_session(url: str, *, app_name: str = "logjam", warehouse: str | None = None,
                 conf: Mapping[str, str] | None = None, pool: str | None = None) -> Any:
    """A SparkSession for `url`. Classic sessions get `warehouse` (or the default) as their warehouse dir.

    `pool` is
    the scheduler pool its jobs run in (INGEST_POOL, MAINTENANCE_POOL; people's queries
    stay in Spark's default pool).
    """
    spark = _session(url, app_name, warehouse, conf)
    if pool is not None:
        # A session setting reaches the scheduler: Spark copies "spark.*" settings into
        # each job's properties, which is where the FAIR scheduler looks for the pool.
        spark.conf.set("spark.scheduler.pool", pool)
    return spark


def _session(url: str, app_name: str, warehouse: str | None, conf: Mapping[str, str] | None) -> Any:
    from pyspark.sql import SparkSession

    if is_connect(url):
        return SparkSession.builder.remote(url).create()
    # A master URL was asked for explicitly; a Connect mode inherited from the environment
    # (a parent process that used Spark Connect exports this) would override it.
    for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
        os.environ.pop(name, None)
    address = driver_address(url)
    builder = SparkSession.builder.master(url).appName(app_name).config(WAREHOUSE_CONF, warehouse or default_warehouse())
    settings = delta_conf({**CLASSIC_CONF, "spark.driver.host": address, "spark.driver.bindAddress": address,
                           "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
                           **(conf or {})}, url)
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def resolve_warehouse(spark: Any, explicit: str | None) -> str:
    """`--warehouse` if given, else the session's own warehouse dir (for Connect: the server's, which
    `logjam-spark` sets to `<data dir>/warehouse`). The path is where the Spark *server* writes."""
    from table.paths import normalise_warehouse

    if explicit:
        return normalise_warehouse(explicit)
    value = spark.conf.get(WAREHOUSE_CONF)
    if value.startswith("file:"):
        # file:/abs/path or file:///abs/path; both are the local path.
        value = "/" + value[len("file:"):].lstrip("/")
    return value.rstrip("/")


def connect_endpoint(url: str) -> tuple[str, int]:
    """(host, port) of a Spark Connect URL `sc://host[:port][/;params]`."""
    parsed = urllib.parse.urlparse(url.split(";", 1)[0])
    return parsed.hostname or "127.0.0.1", parsed.port or defaults.SPARK_PORT


def connect_refused(url: str, timeout: float = 5.0) -> str | None:
    """Why nothing answers at the Connect URL's TCP port (None when something does). pyspark's
    client would retry such a server for about a minute per call before it said so."""
    host, port = connect_endpoint(url)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return f"{host}:{port}: {e.strerror or e}"


def wait_for_connect_server(url: str, stop: threading.Event) -> bool:
    """Poll the Connect endpoint's TCP port so a missing server means waiting, not a long client retry loop."""
    host, port = connect_endpoint(url)
    warned = False
    while not stop.is_set():
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            if not warned:
                log.info("waiting for the Spark Connect server at %s:%d", host, port)
                warned = True
            stop.wait(0.5)
    return False


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
