"""A Spark server that stops making progress (here: its JVM frozen with SIGSTOP, as a long GC
pause or a wedged executor looks to a client). An importer that places its own files
(importer/place.py) goes on committing rows of partitions it knows, since that needs no Spark;
a write that does need Spark (a new stream's partition to register) is noticed, reported in
the log and metrics, and recovered from without a person: every acknowledged event lands
exactly once."""

from __future__ import annotations

import os
import signal

import pytest

from harness.processes import wait_for
from tests.test_importer import Importer
from tests.test_importer_recovery import Journaled, Load, landed


def jvm_of(pid: int) -> int:
    """logjam-spark runs spark-submit's JVM as its child."""
    for task in os.listdir(f"/proc/{pid}/task"):
        for child in open(f"/proc/{pid}/task/{task}/children").read().split():
            if "java" in open(f"/proc/{child}/cmdline", "rb").read().decode(errors="replace"):
                return int(child)
    raise AssertionError("no JVM below logjam-spark")


@pytest.mark.timeout(300)
def test_a_frozen_spark_is_reported_and_recovered_from(spark_server, tmp_path) -> None:
    warehouse, app_env, new_app_env = tmp_path / "wh", "stall-prod", "stall-new-prod"
    j = Journaled(tmp_path / "dev")
    imp = Importer(j.dev, spark_server.url, "--flush-interval", "0.5", "--replay-port", str(j.replay_port),
                   "--write-timeout", "4", warehouse=warehouse, state_dir=tmp_path / "state")
    jvm = jvm_of(spark_server.proc.pid)
    load = new_stream = None
    try:
        imp.wait_ready(j.dev)
        load = Load(j.dev, app_env)
        wait_for(lambda: imp.metric("logjam_importer_rows_written_total") >= 200, timeout=60,
                 what="rows committed before the freeze")
        os.kill(jvm, signal.SIGSTOP)
        try:
            before = imp.metric("logjam_importer_rows_written_total")
            wait_for(lambda: imp.metric("logjam_importer_rows_written_total") >= before + 200, timeout=30,
                     interval=0.2, what="rows of a known partition committed while Spark is frozen")
            assert imp.metric("logjam_importer_write_stalled") == 0
            new_stream = Load(j.dev, new_app_env, per_round=10)  # its partition must be registered
            wait_for(lambda: imp.metric("logjam_importer_write_stalled") == 1, timeout=30, interval=0.2,
                     what="the importer to report the stalled write")
        finally:
            os.kill(jvm, signal.SIGCONT)
        acked = {app_env: load.finish(), new_app_env: new_stream.finish()}
        load = new_stream = None

        def all_landed() -> bool:
            return all(landed(spark_server, warehouse, a)[1] >= n for a, n in acked.items())
        wait_for(all_landed, timeout=120, interval=1, what="every acknowledged event after the thaw")
        for a, n in acked.items():
            ns, rows, distinct = landed(spark_server, warehouse, a)
            assert rows == distinct == n and sorted(ns) == list(range(n)), a
        wait_for(lambda: imp.metric("logjam_importer_write_stalled") == 0, timeout=30, what="the stall to clear")
        assert imp.metric("logjam_importer_write_stalls_total") >= 1
    finally:
        for unfinished in (load, new_stream):
            if unfinished is not None:
                unfinished.finish()
        os.kill(jvm, signal.SIGCONT)
        imp.stop()
        j.close()
    out = imp.output()
    assert "has been pending for" in out and "making progress again" in out, out[-3000:]
