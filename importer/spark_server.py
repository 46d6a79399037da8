"""`logjam-spark`: the Spark Connect server from the installed pyspark, in the foreground.

It runs pyspark's own `spark-submit` with the Connect server class (what
`sbin/start-connect-server.sh` runs, minus the daemonising), as a child process that dies
with us. SIGTERM or SIGINT is passed on to the JVM, which stops its sessions; we then
exit 0. Importers and `logjam-sql` connect to it as thin clients in under a second, where
a JVM per process would take 12-24 s and ~400 MiB.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from importer.paths import default_warehouse, normalise_warehouse
from logjam.config import add_config_flag, parse_args, setup_logging

log = logging.getLogger("logjam-spark")

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
_PR_SET_PDEATHSIG = 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="logjam-spark", description=__doc__.splitlines()[0])
    p.add_argument("--master", default="local[*]", help="local[*], spark://HOST:7077, yarn, k8s://...")
    p.add_argument("--bind", default="127.0.0.1", help="address the Connect server listens on")
    p.add_argument("--port", type=int, default=15002, help="Spark Connect port")
    p.add_argument("--warehouse", metavar="DIR",
                   help="warehouse dir (default $LOGJAM_DATA_DIR/warehouse, i.e. ./data/warehouse)")
    p.add_argument("--driver-memory", default="1g", help="JVM heap of the driver")
    p.add_argument("--conf", action="append", default=None, metavar="KEY=VALUE", help="extra Spark setting; repeatable")
    p.add_argument("-v", "--verbose", action="store_true", help="keep Spark's INFO logging")
    add_config_flag(p)
    return p


def spark_home() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


def command(args: argparse.Namespace, warehouse: str) -> list[str]:
    conf = {
        "spark.connect.grpc.binding.port": str(args.port),
        "spark.connect.grpc.binding.address": args.bind,
        "spark.sql.warehouse.dir": warehouse,
        # No Hive metastore (and no metastore_db/ in the working directory).
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
    }
    if args.master.startswith("local"):
        # Nothing but this host talks to a local driver; keep its ports off other interfaces.
        conf["spark.driver.host"] = "127.0.0.1"
        conf["spark.driver.bindAddress"] = "127.0.0.1"
    for item in args.conf or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"logjam-spark: --conf wants KEY=VALUE, got {item!r}")
        conf[key.strip()] = value
    argv = [
        str(spark_home() / "bin" / "spark-submit"),
        "--class", CONNECT_SERVER_CLASS,
        "--name", "logjam Spark Connect server",
        "--master", args.master,
        "--driver-memory", args.driver_memory,
    ]
    if not args.verbose and LOG4J_CONFIG.exists():
        argv += ["--driver-java-options", f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"]
    for key, value in conf.items():
        argv += ["--conf", f"{key}={value}"]
    return argv


def _die_with_parent() -> None:
    """In the child: get SIGTERM when logjam-spark dies, even by SIGKILL, so no JVM is orphaned."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    # Ctrl-C in a terminal reaches the whole group; let the parent decide when the JVM stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _announce_when_listening(host: str, port: int, proc: subprocess.Popen) -> None:
    probe = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    while proc.poll() is None:
        try:
            with socket.create_connection((probe, port), timeout=0.5):
                log.info("Spark Connect server ready at sc://%s:%d", probe, port)
                return
        except OSError:
            time.sleep(0.25)


def run(args: argparse.Namespace) -> int:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        log.error("Java 17+ is required for Spark, and 'java' is not on PATH (nor JAVA_HOME set)")
        return 2
    warehouse = normalise_warehouse(args.warehouse or default_warehouse())
    if "://" not in warehouse:
        Path(warehouse).mkdir(parents=True, exist_ok=True)
    argv = command(args, warehouse)
    env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_NO_DAEMONIZE="1",
               PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
    if args.master.startswith("local"):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log.info("starting Spark Connect on %s:%d, master %s, warehouse %s", args.bind, args.port, args.master, warehouse)

    stopping = threading.Event()
    proc = subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)

    def forward(signum: int, frame: object) -> None:
        stopping.set()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    threading.Thread(target=_announce_when_listening, args=(args.bind, args.port, proc), daemon=True).start()

    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            continue
    if stopping.is_set():
        # The JVM answers SIGTERM with 143 after running its shutdown hooks: a clean stop.
        log.info("Spark Connect server stopped")
        return 0
    log.error("Spark Connect server exited with status %s", code)
    return code or 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    setup_logging("logjam-spark", args.verbose)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
