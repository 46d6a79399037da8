"""`/healthz` of one importer worker: is it connected to Spark, are its writes landing?

Read from the metrics thread; every attribute it looks at is a plain value the worker's
threads replace whole (GIL-atomic), and anything not set up yet counts as "starting".
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from runtime.health import Check

# Writes failing this long in a row (or --write-timeout, if shorter) make the worker unhealthy: the
# default of --unhealthy-after.
FAILING_FOR = 10.0
# A quarantine keeps /healthz unhealthy this long, so that a person or an alert sees it.
QUARANTINE_WINDOW = 600.0

if TYPE_CHECKING:
    from importer.worker import Worker


def worker_health(worker: "Worker") -> list[Check]:
    """table: the start-up (the table opened or created) is done; writes: no write pending or
    rows waiting longer than --write-timeout since the last commit."""
    now = time.monotonic()
    ready_at = worker.ready_at
    if ready_at is None:
        config = worker.config
        return [Check("table", False, "starting: opening the table" if config.warehouse else
                      f"starting: asking {config.spark} for its warehouse")]
    checks = [Check("table", True, f"writing {worker.location}")]
    limit = worker.config.write_timeout
    writer, batch = worker.writer, worker.group_commit
    started = writer.started if writer is not None else None
    last = worker.last_write
    since = now - (last if last is not None else ready_at)
    last_text = f"last write {now - last:.1f}s ago" if last is not None else "no write yet"
    waiting = (batch.rows if batch is not None else 0) + (writer.pending if writer is not None else 0)
    failing = writer.failing_since if writer is not None else None
    if failing is not None and (now - failing > min(limit, worker.config.unhealthy_after) or writer.last_error is None):
        checks.append(Check("writes", False, f"writes failing for {now - failing:.0f}s: {writer.last_error}; "
                                             f"{last_text}"))
    elif started is not None and now - started > limit:
        checks.append(Check("writes", False, f"a batch write has been pending {now - started:.0f}s "
                                             f"(--write-timeout {limit:g}s); {last_text}"))
    elif waiting and since > limit:
        checks.append(Check("writes", False, f"rows waiting and {last_text} (--write-timeout {limit:g}s)"))
    else:
        checks.append(Check("writes", True, last_text if waiting or last is not None else "idle: nothing to write"))
    quarantined = worker.last_quarantine
    if quarantined is not None and now - quarantined < QUARANTINE_WINDOW:
        checks.append(Check("quarantine", False, f"rows were quarantined {now - quarantined:.0f}s ago "
                                                 "(their writes kept failing; see the log and app_env '~quarantine')"))
    else:
        checks.append(Check("quarantine", True, "no rows quarantined recently"))
    return checks
