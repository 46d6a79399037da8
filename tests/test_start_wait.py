"""Waiting for a slow start (harness/processes.py `wait_for_start`, as tests/spark_fixture.py waits for
logjam-spark): real processes that exit, go quiet, keep printing or open a port, with bounds of
seconds; and the spark fixture's pause of pytest-timeout's timer, in a pytest of its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from harness.processes import REPO, StartFailed, free_port, wait_for_start

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def started(tmp_path) -> Iterator:
    """`start(script)`: `sh -c script` with its output into a log file, as the spark fixture starts
    logjam-spark; every process started is killed after the test."""
    procs: list[subprocess.Popen] = []

    def start(script: str) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"p{len(procs)}.log"
        with open(log, "w") as out:
            procs.append(subprocess.Popen(["sh", "-c", script], stdout=out, stderr=subprocess.STDOUT))
        return procs[-1], log

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_an_exit_fails_at_once_with_the_end_of_its_log(started) -> None:
    proc, log = started("echo booting; echo 'bad flag --nope' >&2; exit 3")
    t0 = time.monotonic()
    with pytest.raises(StartFailed) as e:
        wait_for_start(proc, lambda: False, log, what="the server", quiet=30, limit=60)
    assert time.monotonic() - t0 < 10  # not the quiet or the outer bound
    assert "exited with 3" in str(e.value) and "booting\nbad flag --nope" in str(e.value), e.value


def test_a_quiet_process_fails_after_the_quiet_bound(started) -> None:
    proc, log = started("echo 'loading classes'; exec sleep 60")
    t0 = time.monotonic()
    with pytest.raises(StartFailed) as e:
        wait_for_start(proc, lambda: False, log, what="the server", quiet=1.5, limit=40)
    took = time.monotonic() - t0
    assert 1.5 <= took < 20, took
    assert "no new output and no port opened" in str(e.value) and "loading classes" in str(e.value), e.value
    assert proc.poll() is None  # it is the caller's to stop


def test_output_keeps_the_wait_going_past_the_quiet_bound(started) -> None:
    proc, log = started("i=0; while [ $i -lt 10 ]; do echo step $i; i=$((i+1)); sleep 0.4; done; echo ready; "
                        "exec sleep 60")
    t0 = time.monotonic()
    assert wait_for_start(proc, lambda: "ready" in log.read_text(), log, what="the server", quiet=2.5, limit=40)
    assert time.monotonic() - t0 > 2.5  # longer than the quiet bound, and still waited for


def test_a_port_opening_is_progress(started) -> None:
    """A process silent all along; one of its ports opens before the quiet bound, ready comes after it."""
    proc, log = started("exec sleep 60")
    port = free_port()
    ready = threading.Event()
    listener = socket.socket()

    def serve() -> None:
        time.sleep(2.0)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        time.sleep(2.0)
        ready.set()

    threading.Thread(target=serve, daemon=True).start()
    t0 = time.monotonic()
    try:
        assert wait_for_start(proc, ready.is_set, log, what="the server", ports=[port], quiet=3.0, limit=40)
    finally:
        listener.close()
    assert time.monotonic() - t0 > 3.0


def test_the_outer_bound_ends_a_start_that_never_gets_ready(started) -> None:
    proc, log = started("while :; do echo still starting; sleep 0.2; done")
    t0 = time.monotonic()
    with pytest.raises(StartFailed) as e:
        wait_for_start(proc, lambda: False, log, what="the server", quiet=10, limit=2)
    assert 2 <= time.monotonic() - t0 < 9
    assert "not ready after" in str(e.value) and "still starting" in str(e.value), e.value


# A session fixture that takes 3 s, as logjam-spark's start does at its scale, under a 1 s pytest-timeout.
PAUSED = textwrap.dedent('''
    import time
    import pytest
    from tests.spark_fixture import _timeout_paused

    @pytest.fixture(scope="session")
    def slow(request):
        with _timeout_paused(request) as resume:
            time.sleep(3)
            resume()
            yield

    @pytest.mark.timeout(1)
    def test_setup_is_not_timed(slow):
        pass

    @pytest.mark.timeout(1)
    def test_the_body_is_timed_again(slow):
        time.sleep(3)
''')


def test_the_spark_fixtures_start_is_not_cut_by_the_tests_timeout(tmp_path) -> None:
    (tmp_path / "test_paused.py").write_text(PAUSED)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_paused.py")],
                       capture_output=True, text=True, timeout=50, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    assert "1 failed, 1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    assert "test_the_body_is_timed_again" in r.stdout and "Timeout" in r.stdout, r.stdout[-3000:]
