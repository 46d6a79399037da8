"""Planning a batch's commit (its job): which rows go now, and which wait in the spill for their partitions.

A job registers at most a budget of new partitions, so that a burst of new streams never
holds up the streams that already flow: the rest of the burst waits in the spill
(importer/spill.py), durably, and each later job takes a share of it. The plan is a
`Commit` (importer/commit.py), which the write thread runs and retries.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from importer.commit import Commit, SpillShare, TableTarget
from importer.spill import Spill
from table.partitioning import partitions_of

log = logging.getLogger(__name__)

# New partitions one job may register: a burst of new streams waits in the spill, so the
# streams that flow keep landing. A new partition costs a metastore registration and a file of
# its own: 2-3 ms each on a quiet machine, ten times that on a busy one, so the budget follows
# what the last jobs cost, aiming at NEW_PARTITION_JOB_SECONDS a job. Two such jobs, one under
# way and the one a row rides in, plus the 0.5 s group commit, keep a flowing stream within 10 s.
NEW_PARTITIONS_PER_JOB = 100  # the first job's budget
NEW_PARTITIONS_RANGE = (16, 2000)
NEW_PARTITION_JOB_SECONDS = 2.5


class NewPartitionBudget:
    """How many new partitions the next job may take, so that such a job takes about `seconds`."""

    def __init__(self, seconds: float = NEW_PARTITION_JOB_SECONDS) -> None:
        self.seconds = seconds
        self.allowed = NEW_PARTITIONS_PER_JOB

    def observe(self, new: int, seconds: float) -> None:
        """Learn from a job that took all it was allowed (a burst): only those say what a partition costs."""
        if new < self.allowed or seconds <= 0:
            return
        # The geometric mean of the last budget and the one this job asks for damps the noise
        # of a shared machine; the job's fixed cost makes it converge below `seconds`, not past it.
        wanted = new * self.seconds / seconds
        low, high = NEW_PARTITIONS_RANGE
        self.allowed = max(low, min(high, round((self.allowed * wanted) ** 0.5)))


class Planner:
    """Turns batches into Commits within the new-partition budget, spilling and taking back the rest."""

    def __init__(self, target: TableTarget, spill: Spill | None) -> None:
        self.target = target
        self.spill = spill
        self.budget = NewPartitionBudget()

    def plan(self, table: pa.Table) -> Commit:
        """This batch's job: its rows within the budget, plus a share of the spill if it has room.

        Rows past the budget are put in the spill here, durably, before the job that carries the
        rows which arrived after them can commit."""
        allowed = self.budget.allowed
        job, later, used = self._share(table, allowed)
        if later is not None:
            if self.spill is None:
                return self._commit(table)
            self.spill.put(later)
            log.info("%d rows of new streams wait for their partitions (%d new in this job; %d rows waiting)",
                     later.num_rows, used, self.spill.rows)
            return self._commit(job)
        head = self.spill.head() if self.spill is not None and used < allowed else None
        if head is None:
            return self._commit(job)
        path, spilled = head
        share, rest, _ = self._share(spilled, allowed - used)
        return self._commit(pa.concat_tables([share, job]), (path, rest))

    def _commit(self, rows: pa.Table, share: SpillShare | None = None) -> Commit:
        return Commit(self.target, rows, self.spill, share, on_appended=self.budget.observe)

    def _share(self, table: pa.Table, budget: int) -> tuple[pa.Table, pa.Table | None, int]:
        """(rows of registered partitions and of the first `budget` new ones, the other rows or None, new ones used)."""
        target = self.target
        pairs = partitions_of(table)
        new = [p for p in pairs if not target.partitions.is_registered((target.map.value(*p), p[1]))]
        if len(new) <= budget:
            return table, None, len(new)
        order: dict[tuple[str, str], int] = {}
        keys = list(zip(table.column("app_env").to_pylist(), (d.isoformat() for d in table.column("date").to_pylist())))
        wanted = set(new)
        for key in keys:
            if key in wanted and key not in order:
                order[key] = len(order)
        late = {k for k, i in order.items() if i >= budget}
        mask = pa.array([k not in late for k in keys])
        return table.filter(mask), table.filter(pc.invert(mask)), budget
