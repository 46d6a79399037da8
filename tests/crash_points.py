"""Crash points of the table's commit protocol: run one actor's operation in a real child process and
kill -9 it (or stop it) at its n-th step.

A *step* is one durable effect on the table's directory tree (os.mkdir, rename, replace, link,
unlink, rmdir below the table's location) or one catalog change (an ALTER statement). The
child counts them as the real code makes them, so a test can kill it at each step in turn
(`kill_at`, until it finishes unkilled) or stop it there (`stopped_at`). Nothing of the code
under test is replaced: the counters only wrap the calls.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import sys
sys.path.insert(0, {root!r})
from tests.crash_points import child_main
child_main({spec!r})
"""


def _spark(url: str) -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(url).create()


# -- the operations a child runs (each one actor's real entry point) --------------------------------------------------

def _append(spark: Any, spec: dict) -> None:
    """An importer commits one batch (place, then follow compaction)."""
    import pyarrow.parquet as pq

    from importer.write import TableWriter

    writer = TableWriter(spec["database"], 0, spec["location"])
    writer.write(spark, pq.read_table(spec["rows"]))


def _start(spark: Any, spec: dict) -> None:
    """An importer's start: finish listed placements, then settle its root."""
    from importer.commit import TableTarget
    from table.protocol import settle_root

    TableTarget(spec["database"], 0, spec["location"]).probe_staging(spark)
    settle_root(spark, spec["database"], 0, spec["location"])


def _compact(spark: Any, spec: dict) -> None:
    """One compaction pass, as logjam-sql --compact runs it (no retention)."""
    from warehouse.config import MaintenanceConfig
    from warehouse.maintenance import maintenance_pass

    config = MaintenanceConfig(compact_grace=float(spec.get("grace", 0.0)), compact_fanin=int(spec.get("fanin", 2)))
    maintenance_pass(spark, spec["database"], config, older_than=float(spec.get("older_than", 1e12)),
                     retention=False)


def _retention(spark: Any, spec: dict) -> None:
    from warehouse.retention import expire

    expire(spark, spec["database"], spec["location"], int(spec["days"]))


OPERATIONS: dict[str, Callable[[Any, dict], None]] = {
    "append": _append, "start": _start, "compact": _compact, "retention": _retention,
}


def child_main(spec: dict) -> None:
    table = str(spec["table_dir"])
    at, how = int(spec.get("at", 0)), spec.get("how", "kill")
    steps = [0]

    def step() -> None:
        steps[0] += 1
        if steps[0] == at:
            os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)

    def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            if str(path).startswith(table) or (args and str(args[0]).startswith(table)):
                step()
            return fn(path, *args, **kwargs)
        return call

    for name in ("mkdir", "rename", "replace", "link", "unlink", "rmdir"):
        setattr(os, name, counted(getattr(os, name)))
    spark = _spark(spec["url"])
    real_sql = spark.sql

    def sql(query: str, *args: Any, **kwargs: Any) -> Any:
        if query.lstrip().upper().startswith("ALTER"):
            step()
        return real_sql(query, *args, **kwargs)

    spark.sql = sql
    OPERATIONS[spec["operation"]](spark, spec)
    Path(spec["steps_file"]).write_text(str(steps[0]))


def _spec(tmp: Path, url: str, database: str, location: str, operation: str, **extra: Any) -> dict:
    table_dir = location[len("file:"):] if location.startswith("file:") else location
    return {"url": url, "database": database, "location": location, "table_dir": "/" + table_dir.lstrip("/"),
            "operation": operation, "steps_file": str(tmp / f"steps-{operation}-{time.monotonic_ns()}"), **extra}


def run_child(spec: dict) -> subprocess.Popen:
    code = _CHILD.format(root=str(ROOT), spec=spec)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_at(tmp: Path, url: str, database: str, location: str, operation: str, at: int, **extra: Any) -> bool:
    """Run the operation and kill -9 it at step `at`; True if it was killed there (False: it finished first)."""
    spec = _spec(tmp, url, database, location, operation, at=at, **extra)
    child = run_child(spec)
    _, err = child.communicate(timeout=180)
    if child.returncode == 0:
        return False
    assert child.returncode == -signal.SIGKILL, err.decode(errors="replace")[-3000:]
    return True


def stopped_at(tmp: Path, url: str, database: str, location: str, operation: str, at: int,
               **extra: Any) -> subprocess.Popen | None:
    """Start the operation and return it stopped (SIGSTOP) at step `at`; None if it finished before."""
    spec = _spec(tmp, url, database, location, operation, at=at, how="stop", **extra)
    child = run_child(spec)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if child.poll() is not None:
            assert child.returncode == 0, child.stderr.read().decode(errors="replace")[-3000:]
            return None
        if _state(child.pid) == "T":
            return child
        time.sleep(0.02)
    child.kill()
    raise AssertionError(f"{operation} neither stopped at step {at} nor finished")


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


def resume(child: subprocess.Popen, timeout: float = 180) -> None:
    os.kill(child.pid, signal.SIGCONT)
    _, err = child.communicate(timeout=timeout)
    assert child.returncode == 0, err.decode(errors="replace")[-3000:]


def today() -> datetime.date:
    return datetime.datetime.now(datetime.timezone.utc).date()


def dump(rows: Any, path: Path) -> str:
    import pyarrow.parquet as pq

    pq.write_table(rows, path)
    return str(path)

