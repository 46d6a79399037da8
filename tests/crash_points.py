"""Crash points of the table's commit protocol: run one actor's operation in a real child process and
kill -9 it (or stop it) at its n-th step.

A *step* is one durable effect on the table's directory tree (os.mkdir, rename, replace, link,
unlink, rmdir below the table's location) or one catalog change (an ALTER statement). For a
kill, a call that can only fail without an effect (`makedirs` meeting a dir that exists, an
unlink of a path already gone) is no step: a kill there leaves what a kill at the next real
step leaves, since locks die with the process. A stop counts every call: stopped before taking
a lock (whose `makedirs` is such a call), a process leaves the lock free to others. The child
counts steps as the real code makes them, so a test can kill it at each step in turn
(`kill_at`, until it finishes unkilled) or stop it there (`stopped_at`). Nothing of the code
under test is replaced: the counters only wrap the calls.

Each child is forked from a server process that has already imported the modules every
operation needs (multiprocessing's forkserver with a preload): a fresh process, killed for
real, without the second or more of imports a new interpreter spends before its first step.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import signal
import time
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Callable

# What the children import before their first step, imported once in the fork server instead.
PRELOAD = ["tests.crash_points", "pyspark.sql.connect.session", "pyarrow.parquet", "importer.write",
           "importer.commit", "table.protocol", "warehouse.maintenance", "warehouse.retention"]


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


# When each call is bound to fail and change nothing (os.path.lexists is lstat: no counted call).
NO_EFFECT: dict[str, Callable[..., bool]] = {
    "mkdir": lambda path, *args: os.path.lexists(path),
    "rename": lambda src, *args: not os.path.lexists(src),
    "replace": lambda src, *args: not os.path.lexists(src),
    "link": lambda src, dst, *args: os.path.lexists(dst) or not os.path.lexists(src),
    "unlink": lambda path, *args: not os.path.lexists(path),
    "rmdir": lambda path, *args: not os.path.lexists(path),
}


def child_main(spec: dict) -> None:
    table = str(spec["table_dir"])
    at, how = int(spec.get("at", 0)), spec.get("how", "kill")
    steps = [0]

    def step() -> None:
        steps[0] += 1
        if steps[0] == at:
            os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)

    def counted(fn: Callable[..., Any], no_effect: Callable[..., bool]) -> Callable[..., Any]:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            if (str(path).startswith(table) or (args and str(args[0]).startswith(table))) \
                    and not no_effect(path, *args):
                step()
            return fn(path, *args, **kwargs)
        return call

    for name, no_effect in NO_EFFECT.items():
        setattr(os, name, counted(getattr(os, name), no_effect if how == "kill" else lambda *args: False))
    spark = _spark(spec["url"])
    real_sql = spark.sql

    first_catalog = [spec.get("stop_on") == "catalog"]  # stop before the first catalog change, whatever its step

    def sql(query: str, *args: Any, **kwargs: Any) -> Any:
        if query.lstrip().upper().startswith("ALTER"):
            if first_catalog[0]:
                first_catalog[0] = False
                os.kill(os.getpid(), signal.SIGSTOP)
            step()
        return real_sql(query, *args, **kwargs)

    spark.sql = sql
    OPERATIONS[spec["operation"]](spark, spec)
    Path(spec["steps_file"]).write_text(str(steps[0]))


def _spec(tmp: Path, url: str, database: str, location: str, operation: str, **extra: Any) -> dict:
    table_dir = location[len("file:"):] if location.startswith("file:") else location
    return {"url": url, "database": database, "location": location, "table_dir": "/" + table_dir.lstrip("/"),
            "operation": operation, "steps_file": str(tmp / f"steps-{operation}-{time.monotonic_ns()}"),
            "err_file": str(tmp / f"stderr-{operation}-{time.monotonic_ns()}"), **extra}


class Child:
    """One child process running an operation; what it wrote to stderr goes to a file beside its spec."""

    def __init__(self, process: BaseProcess, err: Path) -> None:
        self.process = process
        self.err = err

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit code, -N for a signal N, None while it runs (or is stopped)."""
        return self.process.exitcode

    def wait(self, timeout: float) -> int:
        """Its exit code; a child still running after `timeout` seconds is killed, and the test fails."""
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(10)
            raise AssertionError(f"a child still ran after {timeout}s:\n{self.errors()}")
        return self.process.exitcode

    def errors(self) -> str:
        """The end of what it wrote to stderr (a traceback when it failed)."""
        try:
            return self.err.read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            return ""


def _child_entry(spec: dict) -> None:
    """In the forked child: stdout dropped, stderr into its file (for the test's message), then the operation."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    err = os.open(spec["err_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(err, 2)
    child_main(spec)


def _forkserver() -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    assert isinstance(context, ForkServerContext)
    context.set_forkserver_preload(PRELOAD)  # takes effect when the server starts, at the first child
    return context


def run_child(spec: dict) -> Child:
    """Start the operation in a child forked from the (preloaded) fork server."""
    process = _forkserver().Process(target=_child_entry, args=(spec,), name=f"crash-{spec['operation']}")
    process.start()
    return Child(process, Path(spec["err_file"]))


def kill_at(tmp: Path, url: str, database: str, location: str, operation: str, at: int, **extra: Any) -> bool:
    """Run the operation and kill -9 it at step `at`; True if it was killed there (False: it finished first)."""
    spec = _spec(tmp, url, database, location, operation, at=at, **extra)
    child = run_child(spec)
    code = child.wait(timeout=180)
    if code == 0:
        return False
    assert code == -signal.SIGKILL, child.errors()
    return True


def stopped_at(tmp: Path, url: str, database: str, location: str, operation: str, at: int,
               **extra: Any) -> Child | None:
    """Start the operation and return it stopped (SIGSTOP) at step `at` (with `stop_on="catalog"`: before its
    first catalog change); None if it finished before."""
    spec = _spec(tmp, url, database, location, operation, at=at, how="stop", **extra)
    child = run_child(spec)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if child.returncode is not None:
            assert child.returncode == 0, child.errors()
            return None
        if _state(child.pid) == "T":
            return child
        time.sleep(0.02)
    child.process.kill()
    raise AssertionError(f"{operation} neither stopped at step {at} nor finished")


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


def resume(child: Child, timeout: float = 180) -> None:
    os.kill(child.pid, signal.SIGCONT)
    assert child.wait(timeout) == 0, child.errors()


def today() -> datetime.date:
    return datetime.datetime.now(datetime.timezone.utc).date()


def dump(rows: Any, path: Path) -> str:
    import pyarrow.parquet as pq

    pq.write_table(rows, path)
    return str(path)

