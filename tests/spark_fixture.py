"""Session-scoped `spark_server` fixture: one real `logjam-spark` (Spark Connect) on a random port.

JVM start-ups are expensive on a small machine, so every test in a session shares this
one server and connects to it as a thin client. Its warehouse is a temporary directory.
The server runs with `chmod`, `ls`, `stat`, `readlink` and `chown` wrapped so that each run
is logged (`SparkServer.forks`): tests/test_localfs.py checks Hadoop forks none of them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from harness.processes import command, free_port, port_open, stop, wait_for_start


@dataclass
class SparkServer:
    proc: subprocess.Popen
    port: int
    warehouse: Path
    log: Path
    forks: Path | None = None  # the session server's: one line per wrapped command it ran, "<name> <args>"
    jdbc: int = 0  # HiveServer2's port, when it runs one
    _session: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def session(self) -> Any:
        """A Connect client session for the test process itself (reading back, preparing data)."""
        if self._session is None:
            from pyspark.sql import SparkSession

            self._session = SparkSession.builder.remote(self.url).create()
        return self._session

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
def spark_server(request, tmp_path_factory) -> SparkServer:
    base = Path(tmp_path_factory.mktemp("spark"))
    forks = base / "forks.log"
    env = dict(os.environ, PATH=f"{_fork_witnesses(base / 'witness', forks)}{os.pathsep}{os.environ['PATH']}")
    with _timeout_paused(request) as resume, running_spark_server(base, env=env, forks=forks) as server:
        resume()
        yield server


@contextmanager
def _timeout_paused(request) -> Iterator[Callable[[], None]]:
    """Stop pytest-timeout's timer for the test that first asks for the server until `resume()` (or the
    block's end) starts it afresh. The timer counts fixture setup too, so the test's own bound would cut
    a start that `running_spark_server` is still right to wait for. Without pytest-timeout, a no-op."""
    item = request._pyfuncitem
    hook = item.config.hook
    try:
        from pytest_timeout import _get_item_settings  # its only way to a test's own timeout

        settings = _get_item_settings(item)
        cancel, arm = hook.pytest_timeout_cancel_timer, hook.pytest_timeout_set_timer
    except (ImportError, AttributeError):
        yield lambda: None
        return
    paused = settings.timeout is not None and settings.timeout > 0 and not settings.func_only
    if paused:
        cancel(item=item)

    def resume() -> None:
        nonlocal paused
        if paused:
            paused = False
            arm(item=item, settings=settings)

    try:
        yield resume
    finally:
        resume()


# At a load average of 15 a start of some 30 s takes minutes and is still sound: the bound in all is
# generous, and what fails a stuck start early is `timeout`, the bound on a start without progress.
START_LIMIT = 15 * 60.0


@contextmanager
def running_spark_server(base: Path, *, jdbc: int = 0, env: dict[str, str] | None = None,
                         forks: Path | None = None, timeout: float = 180) -> Iterator[SparkServer]:
    """A `logjam-spark` over `base`, ready (with HiveServer2 on port `jdbc` unless 0) until the block ends.

    Its start is waited for while it makes progress (harness/processes.py `wait_for_start`): it fails
    at once if the server exits, after `timeout` seconds without new output or a port opening, or
    after START_LIMIT seconds in all, each time with the tail of the server's log."""
    warehouse = base / "warehouse"
    log = base / "logjam-spark.log"
    port = free_port()
    with open(log, "w") as out:
        # A file, not a pipe: a JVM that fills an unread pipe stops dead.
        proc = subprocess.Popen(
            [command("logjam-spark"), "--port", str(port), "--warehouse", str(warehouse), "--jdbc-port", str(jdbc),
             "--metastore", str(base / "metastore")],
            stdout=out, stderr=subprocess.STDOUT, cwd=base, env=env,
        )
    server = SparkServer(proc, port, warehouse, log, forks, jdbc)

    def ready() -> bool:
        return port_open(port) and "table logjam.messages ready" in server.output() and (
            not jdbc or "JDBC (HiveServer2) ready" in server.output())

    try:
        wait_for_start(proc, ready, log, ports=[p for p in (port, jdbc) if p], quiet=timeout, limit=START_LIMIT,
                       interval=0.25, what="logjam-spark to listen and create its table")
        yield server
    finally:
        if server._session is not None:
            try:
                server._session.stop()
            except Exception:
                pass
        code = stop(proc, timeout=60)
        assert code == 0, f"logjam-spark exited with {code}:\n{server.output()}"


WITNESSED = ("chmod", "chown", "ls", "stat", "readlink")


def _fork_witnesses(directory: Path, log: Path) -> Path:
    """A directory of scripts, first on PATH, that log their name and arguments and run the real command."""
    directory.mkdir()
    log.touch()
    for name in WITNESSED:
        script = directory / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n'
                          f'PATH="${{PATH#{directory}{os.pathsep}}}" exec {name} "$@"\n')
        script.chmod(0o755)
    return directory


def database_for(warehouse: Path) -> str:
    """A catalog database of its own for each test's warehouse, on the one shared server."""
    return "t_" + hashlib.sha1(str(warehouse).encode()).hexdigest()[:12]


def table(spark_server: SparkServer, warehouse: Path) -> Any:
    """`<database>.messages` for a test's warehouse as a DataFrame, the Delta table made and named if need be."""
    from table.catalog import ensure_table

    spark = spark_server.session()
    database = database_for(warehouse)
    ensure_table(spark, database, str(warehouse / "messages"))
    return spark.table(f"{database}.messages")


def append_rows(location: str | Path, rows: Any) -> int:
    """`rows` (ARROW_SCHEMA, as importer.decode.BatchBuilder builds them) committed to the Delta table at
    `location` as an importer commits them: `doc` encoded by the importer's encoder, one delta-rs commit
    (table/delta.py `Writer.append`), no app transaction. Returns the rows committed."""
    import pyarrow as pa

    from importer.variant import DocEncoder
    from table.delta import Writer, with_doc

    return Writer(str(location)).append(with_doc(rows, DocEncoder.load().column(rows)),
                                        pa.nulls(rows.num_rows, pa.string()), {})
