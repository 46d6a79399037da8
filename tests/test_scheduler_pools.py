"""logjam-spark's scheduler pools: an importer's write does not wait behind a long compaction job.

Under Spark's default FIFO scheduling a job waits for every task of the jobs before it, and
no task is preempted; warehouse/fairscheduler.xml gives the importers' pool the next free core.
"""

from __future__ import annotations

import threading
import time

import pytest

from table.session import INGEST_POOL, MAINTENANCE_POOL, open_session
from harness.processes import wait_for

pytestmark = pytest.mark.spark

# 80 tasks of 0.5 s: 20 s on 2 cores. The first task to run raises a flag the test can read.
SLOW = ("SELECT reflect('java.lang.System', 'setProperty', 'logjam.test.pools', 'running'), "
        "reflect('java.lang.Thread', 'sleep', bigint(500)) FROM range(0, 80, 1, 80)")
FLAG = "SELECT reflect('java.lang.System', 'getProperty', 'logjam.test.pools')"


@pytest.mark.timeout(240)
def test_an_ingest_job_overtakes_a_long_maintenance_job(spark_server) -> None:
    maintenance = open_session(spark_server.url, pool=MAINTENANCE_POOL)
    ingest = open_session(spark_server.url, pool=INGEST_POOL)
    assert ingest.conf.get("spark.scheduler.pool") == INGEST_POOL
    interrupted: list[BaseException] = []

    def run_slow() -> None:
        try:
            maintenance.sql(SLOW).collect()
        except Exception as e:  # its interruption, once the ingest job has been timed
            interrupted.append(e)

    slow = threading.Thread(target=run_slow, daemon=True)
    slow.start()
    wait_for(lambda: ingest.sql(FLAG).collect()[0][0] == "running", timeout=60, interval=0.1,
             what="the maintenance job to start")
    started = time.monotonic()
    assert ingest.sql("SELECT count(*) FROM range(0, 1000, 1, 2)").collect()[0][0] == 1000
    took = time.monotonic() - started
    still_running = slow.is_alive()
    # The rest of the long job proves nothing more: its tasks are cancelled rather than waited for.
    maintenance.interruptAll()
    slow.join(120)
    assert not slow.is_alive(), "the maintenance job did not stop when interrupted"
    ingest.sql(f"SELECT {FLAG[7:].replace('getProperty', 'clearProperty')}").collect()
    assert still_running, "the maintenance job had ended: the ingest job waited for all of it"
    assert took < 8, f"an ingest job took {took:.1f}s behind a maintenance job"
