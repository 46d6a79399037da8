"""`logjam-spark`: the Spark server of the mesh, in the foreground: Spark Connect, JDBC, and the catalog.

It runs the installed pyspark's own `spark-submit` as a child process that dies with us:
- Spark Connect on `--port` (importers, `logjam-sql`, notebooks);
- HiveServer2 (JDBC/ODBC, `beeline -u jdbc:hive2://HOST:10000`) on `--jdbc-port`, in the
  same JVM (the Thrift server's main class with Connect as a plugin), so both see one
  catalog; `--jdbc-port 0` runs the Connect server alone;
- a Hive metastore in embedded Derby under `--metastore`, holding the name `logjam.messages`
  across restarts (or `--metastore-uri thrift://...` for an existing one).
The JVM reads the table as Delta (table/session.py `delta_conf`). Once the server answers, it
makes sure the Delta table exists (created by delta-rs, table/delta.py) and that the catalog
names it (table/catalog.py), logs `table <database>.messages ready at <location>` (what
`make up` waits for), then runs the table's maintenance with delta-rs (warehouse/maintenance.py) on a schedule. SIGTERM or SIGINT stops maintenance and the JVM, then we exit 0. A JVM that has not
stopped `--stop-timeout` seconds later (a shutdown hook waiting on a busy cluster, a stopped
process) prints its threads into the log and is killed: the JVM only reads the table, so a
killed driver leaves nothing half done, and a stop must be bounded however we are run (a terminal, a supervisor that
signals only us), and say in the log what hung.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from logjam import defaults
from warehouse.maintenance import TableMetrics, add_maintenance_flags, run_maintenance
from table.paths import table_path
from table.schema import DEFAULT_DATABASE, TABLE_NAME
from warehouse.config import SparkServerConfig
from warehouse.spark_jvm import command, listening, localfs_note, spark_home
from runtime.config import add_config_flag, parse_config, setup_logging

log = logging.getLogger("logjam-spark")

_PR_SET_PDEATHSIG = 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="logjam-spark", description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--master", default="local[*]", help="local[*], spark://HOST:7077, yarn, k8s://...")
    p.add_argument("--bind", default="127.0.0.1", help="address the servers (and a cluster driver) listen on")
    p.add_argument("--port", type=int, default=defaults.SPARK_PORT, help="Spark Connect port (default %(default)s)")
    p.add_argument("--jdbc-port", type=int, default=defaults.JDBC_PORT, help="HiveServer2 (JDBC/ODBC) port; 0 turns it off (default %(default)s)")
    p.add_argument("--warehouse", metavar="DIR",
                   help="warehouse dir (default $LOGJAM_DATA_DIR/warehouse, i.e. ./data/warehouse)")
    p.add_argument("--metastore", metavar="DIR", help="embedded metastore dir (default $LOGJAM_DATA_DIR/metastore)")
    p.add_argument("--metastore-uri", metavar="thrift://HOST:9083", help="use this Hive metastore instead")
    p.add_argument("--database", default=DEFAULT_DATABASE, help="database of the messages table")
    p.add_argument("--driver-memory", default="2g", help="JVM heap of the driver (default 2g)")
    p.add_argument("--stop-timeout", type=float, default=20.0, metavar="SECONDS",
                   help="after SIGTERM, how long the JVM may take to stop before it is killed; keep it under "
                        "supervisord's stopwaitsecs (default %(default)s)")
    p.add_argument("--conf", action="append", default=None, metavar="KEY=VALUE", help="extra Spark setting; repeatable")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve the table's Prometheus metrics (partitions, files, compaction, retention) and "
                        "/healthz on this port")
    add_maintenance_flags(p)
    p.add_argument("-v", "--verbose", action="store_true", help="keep Spark's INFO logging")
    add_config_flag(p)
    return p


def _die_with_parent() -> None:
    """In the child: get SIGTERM when logjam-spark dies, even by SIGKILL, so no JVM is orphaned."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    # Ctrl-C in a terminal reaches the whole group; let the parent decide when the JVM stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _prepare(config: SparkServerConfig, proc: subprocess.Popen, stopping: threading.Event,
             metrics: TableMetrics) -> None:
    """Announce the endpoints once they accept, create the table, then run maintenance until stopping."""
    host = config.host
    while proc.poll() is None and not stopping.is_set() and not listening(config.bind, config.port):
        time.sleep(0.25)
    if proc.poll() is not None or stopping.is_set():
        return
    log.info("Spark Connect server ready at sc://%s:%d", host, config.port)
    named = _name_table(config, stopping)
    if config.jdbc_port:
        while proc.poll() is None and not stopping.is_set() and not listening(config.bind, config.jdbc_port):
            time.sleep(0.25)
        if proc.poll() is None:
            log.info("JDBC (HiveServer2) ready at jdbc:hive2://%s:%d", host, config.jdbc_port)
    if named:
        # Maintenance is delta-rs's, in this process: the JVM only reads the table.
        run_maintenance(table_path(config.warehouse), config.maintenance, stopping, metrics)


def _name_table(config: SparkServerConfig, stopping: threading.Event) -> bool:
    """Create the table unless it exists and name it in the catalog; False when stopping first, or when the
    table's location holds what delta-rs must not write (said in the log)."""
    from table.catalog import ensure_table
    from table.delta import UnwritableTable
    from table.session import MAINTENANCE_POOL, first_line, open_session

    while not stopping.is_set():
        try:
            spark = open_session(f"sc://{config.host}:{config.port}", pool=MAINTENANCE_POOL)
            try:
                location = ensure_table(spark, config.database, table_path(config.warehouse))
            finally:
                spark.stop()
            log.info("table %s.%s ready at %s", config.database, TABLE_NAME, location)
            return True
        except UnwritableTable as e:  # trying again would not change it: a person must
            log.error("the table cannot be used: %s", e)
            return False
        except Exception as e:  # the server may still be starting its sessions; try again
            log.warning("cannot prepare the table yet: %s", first_line(e))
            stopping.wait(2.0)
    return False


def _kill_if_hung(proc: subprocess.Popen, exited: threading.Event, timeout: float) -> None:
    """Give the JVM `timeout` s to run its shutdown hooks; then its thread dump (SIGQUIT), and SIGKILL to it
    and to what it started (Python workers): once the JVM is gone they would be nobody's."""
    if exited.wait(timeout):
        return
    log.warning("the Spark JVM has not stopped %.0fs after SIGTERM; killing it (its threads follow, if it can "
                "still print them)", timeout)
    proc.send_signal(signal.SIGQUIT)  # the JVM writes every thread's stack to its stdout: our log
    if exited.wait(2.0):
        return
    for pid in descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.kill()


def descendants(pid: int) -> list[int]:
    """The processes below `pid`, from /proc (Linux, as prctl above)."""
    try:
        direct = [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                  for c in (task / "children").read_text().split()]
    except OSError:
        return []
    return direct + [d for c in direct for d in descendants(c)]


def run(config: SparkServerConfig) -> int:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        log.error("Java 17+ is required for Spark, and 'java' is not on PATH (nor JAVA_HOME set)")
        return 2
    warehouse, metastore = config.warehouse, config.metastore
    if "://" not in warehouse:
        Path(warehouse).mkdir(parents=True, exist_ok=True)
    metastore.mkdir(parents=True, exist_ok=True)
    argv = command(config)
    if (note := localfs_note()) is not None:
        log.warning("%s", note)
    env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_NO_DAEMONIZE="1",
               PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    if config.bind not in ("0.0.0.0", "::"):
        env.setdefault("SPARK_LOCAL_IP", config.bind)
    log.info("starting Spark on %s (Connect :%d%s), master %s, warehouse %s, metastore %s", config.bind, config.port,
             f", JDBC :{config.jdbc_port}" if config.jdbc_port else "", config.master, warehouse,
             config.metastore_uri or metastore)

    stopping, exited = threading.Event(), threading.Event()
    proc = subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL, cwd=metastore)

    def forward(signum: int, frame: object) -> None:
        if stopping.is_set():
            return
        stopping.set()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            threading.Thread(target=_kill_if_hung, args=(proc, exited, config.stop_timeout), name="stop-deadline",
                             daemon=True).start()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    metrics = TableMetrics()
    if config.metrics_port:
        from warehouse.health import spark_server_health
        from runtime.health import serve as serve_http

        serve_http(metrics.registry, config.metrics_port,
                   "0.0.0.0" if config.bind in ("0.0.0.0", "::") else config.bind,
                   health=lambda: spark_server_health(proc, config))
    threading.Thread(target=_prepare, args=(config, proc, stopping, metrics), name="prepare",
                     daemon=True).start()

    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            continue
    exited.set()
    if stopping.is_set():
        # The JVM answers SIGTERM with 143 after running its shutdown hooks: a clean stop (or it was
        # killed at the deadline, which _kill_if_hung has logged).
        log.info("Spark server stopped")
        return 0
    log.error("Spark server exited with status %s", code)
    return code or 1


def main(argv: Sequence[str] | None = None) -> int:
    args, config = parse_config(build_parser(), argv, SparkServerConfig.from_flags)
    if args.check:
        from warehouse.checks import check_spark_server

        return check_spark_server(config)
    setup_logging("logjam-spark", config.verbose)
    from runtime import lifecycle

    lifecycle.exit_with(lambda: run(config))


if __name__ == "__main__":
    sys.exit(main())
