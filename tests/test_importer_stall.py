"""A Spark server that stops making progress (here: its JVM frozen with SIGSTOP, as a long GC
pause or a wedged executor looks to a client) does not hold up the importers: they commit to
the Delta table with delta-rs, so the rows of known streams and of new ones (new partitions)
go on landing while Spark is frozen, no write is reported stalled, and every acknowledged
event lands exactly once."""

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
def test_a_frozen_spark_does_not_hold_up_the_importers(spark_server, tmp_path) -> None:
    warehouse, app_env, new_app_env = tmp_path / "wh", "stall-prod", "stall-new-prod"
    j = Journaled(tmp_path / "dev")
    imp = Importer(j.dev, "--flush-interval", "0.5", "--replay-port", str(j.replay_port),
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
            new_stream = Load(j.dev, new_app_env, per_round=10)  # a new partition, made by the commit itself
            wait_for(lambda: landed(warehouse, new_app_env)[1] >= 100, timeout=30, interval=0.2,
                     what="rows of a new stream committed while Spark is frozen")
            assert imp.metric("logjam_importer_write_stalled") == 0
        finally:
            os.kill(jvm, signal.SIGCONT)
        acked = {app_env: load.finish(), new_app_env: new_stream.finish()}
        load = new_stream = None

        def all_landed() -> bool:
            return all(landed(warehouse, a)[1] >= n for a, n in acked.items())
        wait_for(all_landed, timeout=120, interval=1, what="every acknowledged event after the thaw")
        for a, n in acked.items():
            ns, rows, distinct = landed(warehouse, a)
            assert rows == distinct == n and sorted(ns) == list(range(n)), a
        assert imp.metric("logjam_importer_write_stalls_total") <= 0
    finally:
        for unfinished in (load, new_stream):
            if unfinished is not None:
                unfinished.finish()
        os.kill(jvm, signal.SIGCONT)
        imp.stop()
        j.close()
    assert "has been under way for" not in imp.output()
